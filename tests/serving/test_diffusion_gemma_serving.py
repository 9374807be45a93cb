"""DiffusionGemma through ``dllm serve`` and the official client: the reference's 40 seeded runs
(tests/data/diffusion_gemma_reference), each sent with its seed and its sampler settings as request fields
(``extra_body``; four runs use the checkpoint's and send none), all of a canvas length at once, whole and streamed, so that rows with different settings
share the worker's batches. Each answer is the reference's output up to and including its end, and a
stream sends one chunk per canvas.

The checkpoint ships no tokenizer: a copy of it gets a word-level one (id i is the word ``wNNN``), so that
text maps one to one to ids and the prompt's ids are the reference's (no BOS is added: the tokenizer has
no post-processor, as the reference's prompt ids have none). One server per canvas length: the service's
block length is the checkpoint's canvas. Four runs end at an EOS id that is not the checkpoint's (1): the
API has no per-request EOS id, so they are sent with that token's word as a ``stop`` string, which ends the
answer at the same token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from dllm_contracts.request_setting import settings_of
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from engine_pod.serve.redis_server import free_port
from gateway.tokenizer import GatewayTokenizer
from tests.serving.serve_process import Serve, openai_client

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"
RUNS = json.loads((REFERENCE / "generate.json").read_text())["runs"]
CANVASES = sorted({run["args"]["canvas_length"] for run in RUNS})
EOS = 1  # the checkpoint's
STEPS = 48  # the service's steps per canvas: the most any run asks


def word(token: int) -> str:
    return f"w{token:03d}"


def _checkpoint(directory: Path, canvas: int) -> Path:
    """The reference checkpoint with ``canvas`` as its canvas length and a word-level tokenizer."""
    directory.mkdir()
    config = json.loads((REFERENCE / "config.json").read_text()) | {"canvas_length": canvas}
    (directory / "config.json").write_text(json.dumps(config))
    shutil.copy(REFERENCE / "model.safetensors", directory)
    vocab = {word(i): i for i in range(config["text_config"]["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=word(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # no decoder: tokens joined by spaces
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One ``dllm serve`` per canvas length, started together (torch on one thread each: two cores)."""
    with contextlib.ExitStack() as stack:
        started = {}
        for canvas in CANVASES:
            tmp = tmp_path_factory.mktemp(f"canvas{canvas}")
            model = _checkpoint(tmp / f"dg{canvas}", canvas)
            flags = ("--model", str(model), "--block-length", str(canvas), "--steps-per-block", str(STEPS))
            flags += ("--metrics-port", str(free_port()))
            started[canvas] = Serve(tmp, *flags, env=os.environ | {"OMP_NUM_THREADS": "1"})
            stack.callback(started[canvas].stop)
        for server in started.values():
            server.wait_ready()
        yield started


def _request(run: dict) -> dict:
    """The run as the API's request: its prompt as words, its seed, its budget and the sampler settings
    that are not the checkpoint's (it has no generation config: the reference's defaults, its steps the
    service's); an EOS id other than the checkpoint's as its word, a stop string."""
    args, defaults = run["args"], EntropyBoundParams(max_denoising_steps=STEPS)
    request = {
        "model": f"dg{args['canvas_length']}",
        "prompt": " ".join(word(t) for t in run["prompt_ids"]),
        "max_tokens": args["max_new_tokens"],
        "seed": run["seed"],
        "extra_body": {
            name: args[name]
            for name in settings_of(EntropyBoundParams)
            if args[name] != getattr(defaults, name)
        },
    }
    if args["eos_token_id"] != EOS:
        request["stop"] = [word(args["eos_token_id"])]
    return request


def _expected(run: dict) -> tuple[list[int], str, int, int]:
    """The reference's answer as the API shows it: its visible tokens, finish reason, completion tokens
    (up to and including the stop) and the canvases the answer spans."""
    args, output = run["args"], run["output_ids"][: run["args"]["max_new_tokens"]]
    if args["eos_token_id"] not in output:
        return output, "length", len(output), math.ceil(len(output) / args["canvas_length"])
    stop = output.index(args["eos_token_id"])
    # a stop string leaves the space before it: the canvas holding the stop adds text; an EOS does not
    spanned = stop + 1 if args["eos_token_id"] != EOS else stop
    return output[:stop], "stop", stop + 1, math.ceil(spanned / args["canvas_length"])


async def _whole(client: openai.AsyncOpenAI, run: dict):
    return await client.completions.create(**_request(run))


async def _streamed(client: openai.AsyncOpenAI, run: dict) -> tuple[list[str], str | None]:
    stream = await client.completions.create(**_request(run), stream=True)
    texts, reason = [], None
    async for chunk in stream:
        choice = chunk.choices[0]
        texts += [choice.text] if choice.text else []
        reason = choice.finish_reason or reason
    return texts, reason


async def _all(servers: dict[int, Serve]):
    """Every run's whole answer and its stream, all requests in flight together."""
    clients = {canvas: openai_client(server, asynchronous=True) for canvas, server in servers.items()}
    client_of = [clients[run["args"]["canvas_length"]] for run in RUNS]
    whole = [_whole(client, run) for client, run in zip(client_of, RUNS)]
    streamed = [_streamed(client, run) for client, run in zip(client_of, RUNS)]
    results = await asyncio.gather(*whole, *streamed)
    for client in clients.values():
        await client.close()
    return results[: len(RUNS)], results[len(RUNS) :]


def _cycles(server: Serve) -> float:
    """The block cycles the server's worker ran (its /metrics)."""
    port = re.search(r"--metrics-port (\d+)", " ".join(server.process.args)).group(1)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return float(re.search(r"^dllm_block_cycle_seconds_count (\S+)$", text, re.MULTILINE).group(1))


def test_every_reference_run_passes_through_dllm_serve_whole_and_streamed_per_canvas(servers):
    answers, streams = asyncio.run(_all(servers))
    for canvas, server in servers.items():  # the requests shared cycles: far fewer than their canvases
        canvases = sum(2 * _expected(run)[3] for run in RUNS if run["args"]["canvas_length"] == canvas)
        assert _cycles(server) < canvases / 2
    for index, (run, answer, (texts, reason)) in enumerate(zip(RUNS, answers, streams)):
        tokens, finish, completion, canvases = _expected(run)
        text = answer.choices[0].text
        assert text.split() == [word(t) for t in tokens], index
        assert answer.choices[0].finish_reason == finish, index
        assert answer.usage.completion_tokens == completion, index
        assert answer.usage.prompt_tokens == len(run["prompt_ids"]), index
        assert ("".join(texts), reason) == (text, finish), index
        assert len(texts) == canvases, (index, texts)


def test_the_gateway_reads_the_copy_as_the_reference_prompts_and_the_checkpoints_eos(tmp_path):
    """The prompts' words are their ids; EOS is the text config's id (DiffusionGemma's config.json nests
    it), and the generation config's where it names one (as the engine's)."""
    model = _checkpoint(tmp_path / "model", CANVASES[0])
    tokenizer = GatewayTokenizer(str(model))
    for run in RUNS:
        assert tokenizer.encode(_request(run)["prompt"]) == run["prompt_ids"]
    assert tokenizer.eos_ids == {EOS}
    assert tokenizer.decode([86, 171, EOS, 181]) == "w086 w171"
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, 106]}))
    assert GatewayTokenizer(str(model)).eos_ids == {EOS, 106}


@pytest.mark.parametrize(
    "fields, param, message",
    [
        ({"entropy_bound": 0}, "entropy_bound", "greater than 0"),
        ({"t_min": -0.5}, "t_min", "greater than or equal to 0"),
        ({"stability_threshold": 1.5}, "stability_threshold", "valid integer"),
        ({"max_denoising_steps": STEPS + 1}, "max_denoising_steps", f"above this service's {STEPS}"),
        ({"t_min": 0.5, "t_max": 0.5}, "t_max", "must be above t_min"),
        ({"t_min": 0.9}, None, "must be above t_min 0.9"),  # under the checkpoint's t_max: the worker's
    ],
)
def test_sampler_settings_out_of_range_are_a_400_naming_them(servers, fields, param, message):
    client = openai_client(servers[CANVASES[0]])
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=f"dg{CANVASES[0]}", prompt=word(86), max_tokens=4, extra_body=fields)
    error = refused.value.body
    assert error["param"] == param and message in error["message"], error
