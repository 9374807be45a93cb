"""Benchmark workloads: named ones shipped as JSONL, seeded synthetic generators, and user traces.

A workload item carries text (tokenised with the model's chat template when the model has a
tokenizer) and its token length (so a model without a tokenizer, such as ``random:llada-8b``, gets
random ids of exactly the same geometry).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from dllm_contracts.request_params import REQUEST_SETTINGS
from dllm_contracts.request_setting import SettingError
from engine_pod.bench.shared_workloads import generated_workload
from engine_pod.bench.workload_item import WorkloadError, WorkloadItem, parse_range

WORKLOAD_DIR = Path(__file__).resolve().parents[1] / "workloads"
_SYNTHETIC = re.compile(r"^synthetic(?::(?P<params>.*))?$")


def named_workloads() -> list[str]:
    return sorted(path.stem for path in WORKLOAD_DIR.glob("*.jsonl"))


def _item(line: dict[str, Any], index: int, source: str) -> WorkloadItem:
    try:
        max_tokens = int(line["max_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkloadError(f"{source} line {index + 1}: needs an integer max_tokens") from exc
    prompt = line.get("prompt")
    prompt_tokens = int(line.get("prompt_tokens") or 0)
    if prompt is None and prompt_tokens <= 0:
        raise WorkloadError(f"{source} line {index + 1}: needs a prompt or a positive prompt_tokens")
    try:
        REQUEST_SETTINGS["max_tokens"].check(max_tokens)
    except SettingError as exc:
        raise WorkloadError(f"{source} line {index + 1}: {exc}") from None
    return WorkloadItem(
        request_id=str(line.get("id", f"req-{index}")),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        task=line.get("task"),
        answer=line.get("answer"),
    )


def load_jsonl(path: Path) -> list[WorkloadItem]:
    if not path.is_file():
        raise WorkloadError(f"workload file {path} does not exist")
    items = []
    for index, text in enumerate(path.read_text().splitlines()):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path} line {index + 1} is not JSON: {exc}") from exc
        items.append(_item(line, index, str(path)))
    if not items:
        raise WorkloadError(f"workload file {path} has no requests")
    return items


def synthetic(params: str | None) -> list[WorkloadItem]:
    """``synthetic:n=64,prompt=4-300,gen=32-128,seed=0``: uniform prompt and budget lengths."""
    options = dict(n="64", prompt="4-300", gen="32-128", seed="0")
    for part in filter(None, (params or "").split(",")):
        key, _, value = part.partition("=")
        if key not in options:
            raise WorkloadError(f"synthetic workload: unknown option {key!r} (use n, prompt, gen, seed)")
        options[key] = value
    rng = random.Random(int(options["seed"]))
    (plo, phi), (glo, ghi) = parse_range(options["prompt"], "prompt"), parse_range(options["gen"], "gen")
    return [
        WorkloadItem(f"syn-{i}", None, rng.randint(plo, phi), rng.randint(glo, ghi))
        for i in range(int(options["n"]))
    ]


def load_workload(name_or_path: str) -> list[WorkloadItem]:
    match = _SYNTHETIC.match(name_or_path)
    if match:
        return synthetic(match.group("params"))
    generated = generated_workload(name_or_path)
    if generated is not None:
        return generated
    path = Path(name_or_path)
    if path.suffix == ".jsonl" or path.exists():
        return load_jsonl(path)
    if (WORKLOAD_DIR / f"{name_or_path}.jsonl").is_file():
        return load_jsonl(WORKLOAD_DIR / f"{name_or_path}.jsonl")
    raise WorkloadError(
        f"unknown workload {name_or_path!r}: use one of {named_workloads()}, synthetic[:...], "
        "shared-prefix[:...], multi-turn[:...], or a .jsonl file"
    )
