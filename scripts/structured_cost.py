"""What structured outputs cost the engine: the same prompts answered free and under JSON schemas, R rows
at a time through BlockServe, on random weights of LLaDA-8B's vocabulary (126,464 entries: the LM head and
the grammar's masks at a real size), grammars compiled for a byte-level tokenizer of that size.

Reports, for free and constrained rows: tokens committed per forward per row, generated tokens per second
(until each answer's end, or its budget), and for constrained rows the grammar's host time per step (its
bitmasks, computed for every constrained row together, and the walk over the step's proposals), with how
many tokens the grammar forced.

    python scripts/make_byte_tokenizer.py --llada-8b /tmp/tok126k
    python scripts/structured_cost.py /tmp/tok126k --rows 16 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(loaded, compiler, rows: int, constrained: bool, max_tokens: int) -> dict:
    """``rows`` requests of the same prompts, free or each under a schema (the schemas in turn), answered
    through BlockServe at once."""
    from dllm_contracts.request_params import RequestParams
    from dllm_contracts.scheduler_config import SchedulerConfig
    from dllm_contracts.structured_output import ResponseGrammar, json_grammar
    from engine_pod.bench.structured_schemas import SCHEMAS
    from engine_pod.decoding.config import DecodingConfig
    from engine_pod.engine import Engine
    from engine_pod.runner.contract import scheduling_facts
    from engine_pod.runner.factory import make_runner
    from engine_pod.scheduler.blockserve import BlockServeScheduler

    decoding = DecodingConfig()
    budget = rows * (64 + max_tokens + 2 * decoding.block_length)
    runner = make_runner(loaded, decoding, pool_tokens=budget)
    runner.stepper.grammars._compiler = compiler  # the grammar at the real vocabulary's tokenizer
    steps: list[int] = []  # every active row's forwards in each cycle
    run_cycle = runner.run

    def counted(cycle):
        output = run_cycle(cycle)
        steps.extend(s for s, row in zip(output.steps, cycle.rows) if row.active)
        return output

    runner.run = counted
    eos = list(loaded.config.eos_token_ids)
    config = SchedulerConfig(token_budget=budget, layout="packed")
    scheduler = BlockServeScheduler(decoding.block_length, eos, config, **scheduling_facts(runner))
    engine = Engine(runner, scheduler)
    names = list(SCHEMAS)
    for i in range(rows):
        prompt = [1000 + (17 * i + j) % 5000 for j in range(24 + i % 8)]
        grammar = None
        if constrained:
            grammar = ResponseGrammar(json_grammar(SCHEMAS[names[i % len(names)]][0]), "json_schema")
        engine.add_request(
            scheduler.request_for(f"r{i}", prompt, RequestParams(max_tokens=max_tokens, grammar=grammar))
        )
    forwards = masks = walked = 0
    mask_s = walk_s = 0.0
    finished = []
    started = time.perf_counter()
    while engine.has_work():
        result = engine.step()
        forwards += result.stats.forwards
        masks += result.stats.grammar_masks
        mask_s += result.stats.grammar_mask_seconds
        walk_s += result.stats.grammar_walk_seconds
        walked += result.stats.grammar_walk_commits
        finished += result.finished
    elapsed = time.perf_counter() - started
    answers = [request.generated[:max_tokens] for request in finished]
    answer_tokens = sum(next((i for i, t in enumerate(a) if t in eos), len(a)) for a in answers)
    return {
        "rows": rows,
        "constrained": constrained,
        "forwards": forwards,
        "tokens_per_forward_per_row": round(decoding.block_length * len(steps) / max(1, sum(steps)), 2),
        "answer_tokens": answer_tokens,
        "answer_tokens_per_s": round(answer_tokens / elapsed, 1),
        "elapsed_s": round(elapsed, 2),
        "grammar_masks": masks,
        "grammar_mask_ms_per_step": round(1e3 * mask_s / max(1, forwards), 2),
        "grammar_walk_ms_per_step": round(1e3 * walk_s / max(1, forwards), 2),
        "tokens_forced_or_walked": walked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", type=Path, help="a byte-level tokenizer of 126,464 entries")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the grammar's too)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    import torch  # after the arguments: --help loads no model stack

    from engine_pod.decoding.grammar.compiler import GrammarCompiler
    from engine_pod.loading.loader import load_model

    torch.set_num_threads(args.threads)
    loaded = load_model("random:llada-tiny-8b-vocab")
    config = loaded.config
    compiler = GrammarCompiler.from_directory(
        args.tokenizer, config.vocab_size, config.eos_token_ids, args.threads
    )
    report = [
        run(loaded, compiler, rows, constrained, args.max_tokens)
        for rows in args.rows
        for constrained in (False, True)
    ]
    print(json.dumps({"threads": args.threads, "runs": report}, indent=1))


if __name__ == "__main__":
    main()
