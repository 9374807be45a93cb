"""Structured outputs through ``dllm serve`` with the official ``openai`` client, on random weights (their
answers mean nothing: only the grammar makes them valid). For each model: 200 requests by default, sent
``--concurrency`` at a time, over every schema of engine_pod/bench/structured_schemas.py (greedy and
sampled), JSON mode, and tool calls (``required``, a named function, ``auto``), each tool-call request
streamed too with the same seed. Prints a JSON report per model: how many answers finished (``stop`` or
``tool_calls``) and were cut (``length``), and the faults, which must all be zero: a finished answer that
does not parse or validate, a cut answer that is not ``max_tokens`` long, a stream that does not reassemble
to the whole answer.

    python scripts/structured_outputs_run.py --model random:llada-tiny --model random:dream-tiny \\
        --model random:llada2-tiny --model random:sdar-tiny --model random:diffusion-gemma-tiny
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_pod.bench.structured_schemas import SCHEMAS  # noqa: E402

ASK = [{"role": "user", "content": "answer in the format asked"}]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMAS["weather_args"][0]}},
    {"type": "function", "function": {"name": "lookup", "parameters": SCHEMAS["person"][0]}},
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
CHOICES = ["required", {"type": "function", "function": {"name": "lookup"}}, "auto"]


def plan(requests: int) -> list[dict]:
    """The requests: three in four over the schemas, then JSON mode and tool calls, seeds varying."""
    out = []
    names = list(SCHEMAS)
    for i in range(requests):
        seed = {} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
        if i % 8 < 6:
            name = names[i % len(names)]
            fmt = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": SCHEMAS[name][0], "strict": True},
            }
            out.append({"kind": "json_schema", "schema": name, "fields": {"response_format": fmt, **seed}})
        elif i % 8 == 6:
            out.append(
                {"kind": "json_object", "fields": {"response_format": {"type": "json_object"}, **seed}}
            )
        else:
            choice = CHOICES[(i // 8) % len(CHOICES)]
            fields = {"tools": TOOLS, "tool_choice": choice, "temperature": 0.7, "seed": i}
            out.append({"kind": f"tools:{choice if isinstance(choice, str) else 'named'}", "fields": fields})
    return out


def faults_of(case: dict, choice, usage, max_tokens: int) -> list[str]:
    """What is wrong with one answer (nothing: [])."""
    reason, message = choice.finish_reason, choice.message
    if reason == "length":
        return (
            [] if usage.completion_tokens == max_tokens else [f"length at {usage.completion_tokens} tokens"]
        )
    try:
        if case["kind"] == "json_schema":
            jsonschema.validate(json.loads(message.content), SCHEMAS[case["schema"]][0])
        elif case["kind"] == "json_object":
            if not isinstance(json.loads(message.content), dict):
                return ["not an object"]
        elif reason == "tool_calls":
            for call in message.tool_calls:
                wanted = "lookup" if case["kind"] == "tools:named" else None
                if wanted and call.function.name != wanted or call.function.name not in PARAMETERS:
                    return [f"called {call.function.name}"]
                jsonschema.validate(json.loads(call.function.arguments), PARAMETERS[call.function.name])
        elif case["kind"] != "tools:auto" or reason != "stop" or not isinstance(message.content, str):
            return [f"finish_reason {reason}"]
    except (ValueError, jsonschema.ValidationError) as exc:
        return [f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"]
    return []


def streamed(client, model: str, fields: dict, max_tokens: int):
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(
        model=model, messages=ASK, max_tokens=max_tokens, stream=True, **fields
    ):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, ["", ""])
            entry[0] += call.function.name or ""
            entry[1] += call.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return content or None, [tuple(entry) for _, entry in sorted(calls.items())], reason


def run_one(client, model: str, case: dict, max_tokens: int) -> dict:
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=max_tokens, **case["fields"])
    choice = reply.choices[0]
    faults = faults_of(case, choice, reply.usage, max_tokens)
    if case["kind"].startswith("tools"):
        whole = (
            choice.message.content,
            [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []],
            choice.finish_reason,
        )
        if streamed(client, model, case["fields"], max_tokens) != whole:
            faults.append("the stream does not reassemble to the whole answer")
    return {"kind": case["kind"], "reason": choice.finish_reason, "faults": faults}


def serve(model: str, directory: Path) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "engine_pod.cli.main", "serve", "--port", "0", "--model", model]
    log = open(directory / "serve.log", "w")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        argv + ["--data-dir", str(directory / "data")], stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        found = re.search(r"API at (http://[^ ]+/v1)", (directory / "serve.log").read_text())
        if found:
            return process, found.group(1)
        time.sleep(0.2)
    raise SystemExit(f"dllm serve did not start: {(directory / 'serve.log').read_text()[-2000:]}")


def run_model(model: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        process, url = serve(model, Path(tmp))
        try:
            client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            served = client.models.list().data[0].id
            started = time.monotonic()
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(
                    pool.map(lambda case: run_one(client, served, case, max_tokens), plan(requests))
                )
            elapsed = time.monotonic() - started
        finally:
            process.send_signal(2)
            process.wait(timeout=120)
    kinds: dict[str, dict[str, int]] = {}
    for result in results:
        counts = kinds.setdefault(result["kind"], {"requests": 0, "finished": 0, "length": 0})
        counts["requests"] += 1
        counts["finished" if result["reason"] != "length" else "length"] += 1
    faults = [fault for result in results for fault in result["faults"]]
    finished = sum(result["reason"] != "length" for result in results)
    return {
        "model": model,
        "requests": len(results),
        "schemas": len(SCHEMAS),
        "finished_share": finished / len(results),
        "kinds": kinds,
        "faults": faults,
        "elapsed_s": round(elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, help="a model dllm serve takes (repeat)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    reports = [run_model(model, args.requests, args.concurrency, args.max_tokens) for model in args.model]
    print(json.dumps(reports, indent=1))
    if any(report["faults"] for report in reports):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
