"""``dllm eval``: generation quality of a model on the held-out synthetic tasks, under any policy."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from dllm_contracts.scheduler_config import SchedulerConfig
from dllm_contracts.text import cut_at_eos
from engine_pod.bench.execute import run_policy
from engine_pod.bench.policies import PolicySpec, static_batch_size_for
from engine_pod.bench.results import PreparedRequest
from engine_pod.decoding.config import DecodingConfig
from engine_pod.loading.loader import LoadedModel
from engine_pod.prompts import encode_prompt
from engine_pod.synthetic.tasks import Example, eval_set


@dataclass(frozen=True)
class EvalConfig:
    n: int = 140
    seed: int = 1234
    max_tokens: int = 128
    token_budget: int = 8192
    tasks: tuple[str, ...] | None = None


def _prepare(loaded: LoadedModel, examples: list[Example], max_tokens: int) -> list[PreparedRequest]:
    if loaded.tokenizer is None:
        raise ValueError("evaluation needs the model's tokenizer (the model directory has none)")
    return [
        PreparedRequest(f"ex-{i}", encode_prompt(loaded.tokenizer, e.prompt, chat=True), max_tokens)
        for i, e in enumerate(examples)
    ]


def _score(loaded: LoadedModel, example: Example, generated: list[int]) -> dict:
    eos = loaded.config.eos_token_ids
    answer_ids = loaded.tokenizer(example.answer, add_special_tokens=False)["input_ids"]
    kept = cut_at_eos(generated, eos)
    text = loaded.tokenizer.decode(
        [t for t in kept if t != loaded.config.mask_token_id], skip_special_tokens=True
    )
    ends_right = len(kept) == len(answer_ids) and len(kept) < len(generated)
    return {
        "task": example.task,
        "prompt": example.prompt,
        "answer": example.answer,
        "output": text,
        "exact_match": " ".join(text.split()) == " ".join(example.answer.split()),
        "length_correct": ends_right,
        "token_ids": kept,
    }


def _summary(scored: list[dict]) -> dict:
    by_task: dict[str, list[dict]] = defaultdict(list)
    for item in scored:
        by_task[item["task"]].append(item)

    def figures(items: list[dict]) -> dict:
        return {
            "n": len(items),
            "exact_match": round(sum(i["exact_match"] for i in items) / len(items), 4),
            "length_accuracy": round(sum(i["length_correct"] for i in items) / len(items), 4),
        }

    return figures(scored) | {"per_task": {task: figures(items) for task, items in sorted(by_task.items())}}


def evaluate(loaded: LoadedModel, decoding: DecodingConfig, policies: list[str], cfg: EvalConfig) -> dict:
    examples = eval_set(cfg.n, cfg.seed, list(cfg.tasks) if cfg.tasks else None)
    requests = _prepare(loaded, examples, cfg.max_tokens)
    widths = [len(r.prompt_ids) + cfg.max_tokens for r in requests]
    batch = static_batch_size_for(widths, cfg.token_budget)
    report: dict = {"n": len(examples), "seed": cfg.seed, "decoding": asdict(decoding), "policies": {}}
    outputs: dict[str, list[dict]] = {}
    for name in policies:
        run = run_policy(
            loaded,
            decoding,
            PolicySpec(name, SchedulerConfig(token_budget=cfg.token_budget), batch),
            requests,
            record_margins=False,
        )
        scored = [_score(loaded, e, run.outcomes[r.request_id].generated) for e, r in zip(examples, requests)]
        outputs[name] = scored
        generated = sum(len(s["token_ids"]) + 1 for s in scored)
        stats = {
            "wall_s": round(run.wall_s, 3),
            "tokens_per_s": round(generated / run.wall_s, 2),
            "num_forward_passes": sum(c.forwards for c in run.cycles),
            # the dual cache's keys and values over the run's cycles: all of them, and what was kept
            "kv_dense_bytes": sum(c.kv_dense_bytes for c in run.cycles),
            "kv_kept_bytes": sum(c.kv_kept_bytes for c in run.cycles),
        }
        report["policies"][name] = _summary(scored) | {"generation": stats}
    report |= _agreement(outputs)
    first = report["policies"][policies[0]]
    report |= {
        "exact_match": first["exact_match"],
        "length_accuracy": first["length_accuracy"],
        "per_task": first["per_task"],
    }
    report["_outputs"] = outputs
    return report


def _agreement(outputs: dict[str, list[dict]]) -> dict:
    names = list(outputs)
    if len(names) < 2:
        return {}
    base = outputs[names[0]]
    agreement = {}
    for name in names[1:]:
        same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(base, outputs[name]))
        agreement[name] = round(same / len(base), 4)
    return {"agreement_with": names[0], "output_agreement": agreement}


def write_outputs(report: dict, path: Path) -> None:
    lines = []
    for policy, scored in report["_outputs"].items():
        for item in scored:
            record = {k: v for k, v in item.items() if k != "token_ids"} | {"policy": policy}
            lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")
