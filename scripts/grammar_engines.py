"""Compare grammar engines for structured outputs at a real model's vocabulary size.

For llguidance, xgrammar and outlines-core: the tokenizer's one-time preparation, each schema's compile
time (first and again, where the library caches compiled grammars), which of the structured-output schemas
compile and accept a valid instance (engine_pod/bench/structured_schemas.py), and the time to compute the
token bitmasks of R rows per step (R = 16 and 64), each row stepping through a valid instance of its
schema token by token. Prints a JSON report.

    python scripts/make_byte_tokenizer.py --llada-8b /tmp/tok126k   # LLaDA-8B's vocabulary size
    python scripts/grammar_engines.py /tmp/tok126k --rows 16 64 --threads 2

outlines-core and xgrammar are not dependencies of the project: install them to compare
(``pip install outlines-core==0.2.14``; ``pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_pod.bench.structured_schemas import SCHEMAS  # noqa: E402

COMPACT = (", ", ": ")
STEPS = 24  # steps timed per row count (each row advances one token per step)


def instance_text(instance) -> str:
    return json.dumps(instance, separators=COMPACT)


class Llguidance:
    name = "llguidance"

    def __init__(self, directory: Path, vocab: int, eos: int, threads: int) -> None:
        import llguidance as llg

        self.llg = llg
        started = time.perf_counter()
        self.tokenizer = llg.LLTokenizer(
            (directory / "tokenizer.json").read_text(), n_vocab=vocab, eos_token=eos
        )
        self.prepare_s = time.perf_counter() - started
        self.executor = llg.LLExecutor(num_threads=threads)
        self.words = (vocab + 31) // 32
        self.options = {
            "whitespace_flexible": False,
            "item_separator": COMPACT[0],
            "key_separator": COMPACT[1],
        }

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, overrides=self.options)
        error = self.llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise ValueError(error)
        return grammar

    def matcher(self, compiled):
        matcher = self.llg.LLMatcher(self.tokenizer, compiled)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def masks(self, matchers, out: np.ndarray) -> None:
        self.executor.unsafe_compute_mask_ptr(
            [(m, i) for i, m in enumerate(matchers)], out.ctypes.data, self.words * 4, out.shape[0]
        )

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def can_end(self, matcher) -> bool:
        return matcher.is_accepting()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, directory: Path, vocab: int, eos: int, threads: int) -> None:
        import xgrammar as xgr
        from transformers import AutoTokenizer

        self.xgr = xgr
        hf = AutoTokenizer.from_pretrained(str(directory))
        started = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=True)
        self.prepare_s = time.perf_counter() - started
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads)
        self.eos = eos
        self.words = (vocab + 31) // 32

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=COMPACT)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def masks(self, matchers, out: np.ndarray) -> None:
        import torch

        self.batch.batch_fill_next_token_bitmask(matchers, torch.from_numpy(out))

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def can_end(self, matcher) -> bool:
        return matcher.accept_token(self.eos)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, directory: Path, vocab: int, eos: int, threads: int) -> None:
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.regex_of = oc, build_regex_from_schema
        started = time.perf_counter()
        self.vocabulary = oc.Vocabulary(eos, _token_bytes(directory, eos))
        self.eos = eos
        self.prepare_s = time.perf_counter() - started
        self.words = (vocab + 31) // 32

    def compile(self, schema):
        regex = self.regex_of(json.dumps(schema), r"[ ]?")  # at most one space between tokens
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def masks(self, matchers, out: np.ndarray) -> None:
        for i, guide in enumerate(matchers):
            row = out[i]
            guide.write_mask_into(row.ctypes.data, row.size, 4)

    def accept(self, matcher, token: int) -> bool:
        try:
            matcher.advance(token)
        except ValueError:
            return False
        return True

    def can_end(self, matcher) -> bool:
        return matcher.is_finished() or self.eos in matcher.get_tokens()


def _token_bytes(directory: Path, eos: int) -> dict[bytes, list[int]]:
    """Each ordinary token's bytes (byte-level BPE), as outlines-core's vocabulary takes them."""
    decode = {c: b for b, c in _bytes_to_unicode().items()}
    data = json.loads((directory / "tokenizer.json").read_text())
    special = {t["id"] for t in data.get("added_tokens", [])}
    out: dict[bytes, list[int]] = {}
    for token, index in data["model"]["vocab"].items():
        if index in special or index == eos:
            continue
        out.setdefault(bytes(decode[c] for c in token), []).append(index)
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


# keywords probed with an instance that breaks them: an engine enforces a keyword (the instance is
# refused), refuses the schema (an error naming it), or ignores it (the instance passes: an answer could
# break the schema)
PROBES = {
    "maxLength with pattern": ({"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}, "abcdefghij"),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, 4),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1]),
    "not": ({"not": {"type": "string"}}, "x"),
    "minProperties": ({"type": "object", "minProperties": 1}, {}),
    "oneOf (overlapping)": ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1),
    "exclusiveMaximum": ({"type": "number", "exclusiveMaximum": 1}, 1),
    "format: email": ({"type": "string", "format": "email"}, "nope"),
}


def probes(engine, tokenizer) -> dict[str, str]:
    out = {}
    for name, (schema, bad) in PROBES.items():
        try:
            matcher = engine.matcher(engine.compile(schema))
        except Exception as exc:  # noqa: BLE001 - a refusal is a result
            out[name] = "refuses: " + str(exc).splitlines()[0][:80]
            continue
        ids = tokenizer.encode(instance_text(bad))
        accepted = all(engine.accept(matcher, t) for t in ids) and engine.can_end(matcher)
        out[name] = "ignores" if accepted else "enforces"
    return out


ENGINES = {"llguidance": Llguidance, "xgrammar": Xgrammar, "outlines-core": OutlinesCore}


def coverage_and_compile(engine, tokenizer) -> dict:
    """Per schema: first and repeated compile time (ms), and whether a valid instance is accepted."""
    out = {}
    for name, (schema, instance) in SCHEMAS.items():
        try:
            started = time.perf_counter()
            compiled = engine.compile(schema)
            first = time.perf_counter() - started
            started = time.perf_counter()
            engine.compile(schema)
            again = time.perf_counter() - started
            matcher = engine.matcher(compiled)
            ids = tokenizer.encode(instance_text(instance))
            accepted = all(engine.accept(matcher, t) for t in ids) and engine.can_end(matcher)
            out[name] = {"compile_ms": first * 1e3, "again_ms": again * 1e3, "accepts_instance": accepted}
        except Exception as exc:  # noqa: BLE001 - a library's refusal is what is measured
            out[name] = {"error": str(exc).splitlines()[0][:160]}
    return out


def mask_times(engine, tokenizer, rows: int, compiled: dict) -> dict:
    """Per step, the time to fill every row's bitmask (one batch call where the library has one), and the
    time to advance every row's matcher by its next token; rows cycle over the schemas."""
    names = [n for n in SCHEMAS if n in compiled]
    plan = [names[i % len(names)] for i in range(rows)]
    texts = {n: tokenizer.encode(instance_text(SCHEMAS[n][1])) for n in names}
    matchers = [engine.matcher(compiled[n]) for n in plan]
    cursor = [0] * rows
    out = np.zeros((rows, engine.words), dtype=np.int32)
    fill, advance = [], []
    for _ in range(STEPS):
        started = time.perf_counter()
        engine.masks(matchers, out)
        fill.append(time.perf_counter() - started)
        started = time.perf_counter()
        for r in range(rows):
            ids = texts[plan[r]]
            if cursor[r] >= len(ids):  # the row's answer is done: a new request of the same schema
                matchers[r], cursor[r] = engine.matcher(compiled[plan[r]]), 0
            engine.accept(matchers[r], ids[cursor[r]])
            cursor[r] += 1
        advance.append(time.perf_counter() - started)
    return {
        "fill_ms_median": statistics.median(fill) * 1e3,
        "fill_ms_p90": sorted(fill)[int(0.9 * len(fill))] * 1e3,
        "advance_ms_median": statistics.median(advance) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tokenizer", type=Path, help="a directory with a byte-level tokenizer.json")
    parser.add_argument("--vocab", type=int, default=126464, help="the model's vocabulary (LLaDA-8B's)")
    parser.add_argument("--eos", type=int, default=126081, help="the end-of-text id (LLaDA-8B's)")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--threads", type=int, default=2, help="threads each library may use")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    report = {"vocab": args.vocab, "threads": args.threads, "schemas": len(SCHEMAS), "engines": {}}
    for name in args.engines:
        engine = ENGINES[name](args.tokenizer, args.vocab, args.eos, args.threads)
        covered = coverage_and_compile(engine, tokenizer)
        compiled = {n: engine.compile(SCHEMAS[n][0]) for n, r in covered.items() if r.get("accepts_instance")}
        result = {"prepare_s": engine.prepare_s, "schemas": covered, "accepted": len(compiled)}
        result["probes"] = probes(engine, tokenizer)
        result["masks"] = {str(rows): mask_times(engine, tokenizer, rows, compiled) for rows in args.rows}
        compiles = [r["compile_ms"] for r in covered.values() if "compile_ms" in r]
        result["compile_ms_median"] = statistics.median(compiles) if compiles else None
        result["compile_ms_max"] = max(compiles) if compiles else None
        report["engines"][name] = result
        print(json.dumps({name: {k: v for k, v in result.items() if k != "schemas"}}), file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
