"""DiffusionGemma against the vectors of the pinned transformers reference (tests/data/
diffusion_gemma_reference, made by scripts/make_diffusion_gemma_reference.py; the vectors are the
contract, the reference code is not imported): the forward step by step, the sampler on the
reference's own logits, whole seeded generate runs token for token, the config defaults, the
checkpoint layouts and the multimodal refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine_pod.decoding.entropy_bound import entropy_bound_step, start_canvas, temperatures
from engine_pod.families.diffusion_gemma.config import diffusion_gemma_config
from engine_pod.families.diffusion_gemma.generate import generate
from engine_pod.families.diffusion_gemma.multimodal import MultimodalInputError, refuse_multimodal_inputs
from engine_pod.families.diffusion_gemma.sampler_settings import EntropyBoundParams
from engine_pod.kinds.canvas.context_cache import ContextCache
from engine_pod.loading.loader import load_model
from engine_pod.models.checkpoint_files import CheckpointError
from engine_pod.models.config import ModelConfigError

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "diffusion_gemma_reference"
TRACE = json.loads((REFERENCE / "trace.json").read_text())
RUNS = json.loads((REFERENCE / "generate.json").read_text())["runs"]
DEFAULT_CASES = json.loads((REFERENCE / "config_defaults.json").read_text())["cases"]
LOGITS_ATOL = 1e-4  # measured: identical bits at one thread, 2.2e-5 at most at two (logits up to 25)
PARAM_FIELDS = (
    "max_denoising_steps",
    "entropy_bound",
    "t_min",
    "t_max",
    "stability_threshold",
    "confidence_threshold",
)


@pytest.fixture(scope="module")
def model():
    return _load(REFERENCE)


def _load(directory: Path):
    """The checkpoint's model, as the engine loads it (float32, on the CPU)."""
    return load_model(str(directory)).model


def _params(args: dict) -> EntropyBoundParams:
    return EntropyBoundParams(**{name: args[name] for name in PARAM_FIELDS})


def _trace_canvases() -> list[list[dict]]:
    """The trace's steps grouped by canvas (a canvas's steps share their positions)."""
    canvases: list[list[dict]] = []
    for step in TRACE["steps"]:
        if not canvases or canvases[-1][0]["positions"] != step["positions"]:
            canvases.append([])
        canvases[-1].append(step)
    return canvases


def _cache_for(model, tokens: int) -> ContextCache:
    """A context of up to ``tokens`` tokens in a pool of its own."""
    return ContextCache.alone(model.config, tokens, torch.float32, torch.device("cpu"))


def _committed(run: dict, index: int) -> list[int]:
    length = run["args"]["canvas_length"]
    return run["output_ids"][index * length : (index + 1) * length]


def test_forward_matches_reference_logits_step_by_step(model):
    """Each decoder forward of the trace from the reference's inputs: its canvas, its context (prompt,
    then the committed canvases) and the previous step's processed logits as self-conditioning."""
    run, logits = TRACE["run"], load_file(str(REFERENCE / "trace_logits.safetensors"))
    cache = _cache_for(model, len(run["prompt_ids"]) + len(run["output_ids"]))
    model.encode(torch.tensor([run["prompt_ids"]]), cache)
    for index, steps in enumerate(_trace_canvases()):
        if index:
            model.encode(torch.tensor([_committed(run, index - 1)]), cache)
        soft = None
        for step in steps:
            assert step["positions"][0] == cache.length and step["self_conditioning"] == (soft is not None)
            ours = model.denoise(torch.tensor([step["canvas_input"]]), cache, soft)[0]
            expected = logits[step["logits_key"]]
            torch.testing.assert_close(ours, expected, rtol=0, atol=LOGITS_ATOL)
            assert torch.equal(ours.argmax(-1), expected.argmax(-1))
            processed = expected / torch.tensor(step["temperature"], dtype=torch.float32)
            soft = model.soft_embeddings(processed[None])


def test_temperature_schedule_rounds_as_the_reference():
    params = _params(TRACE["run"]["args"])
    for step in TRACE["steps"]:
        ours = temperatures([params], torch.tensor([step["steps_remaining"]]))
        assert ours.item() == step["temperature"]


def test_sampler_reproduces_the_reference_canvases_from_its_logits():
    """The sampler alone, on the reference's logits with the run's seed: every canvas the reference fed
    its decoder (the initial noise, then accepted and renoised tokens), every stop and committed canvas."""
    run, logits = TRACE["run"], load_file(str(REFERENCE / "trace_logits.safetensors"))
    generator = torch.Generator().manual_seed(run["seed"])
    params, length = _params(run["args"]), run["args"]["canvas_length"]
    for index, steps in enumerate(_trace_canvases()):
        rows = start_canvas([params], [generator], length, 256, torch.device("cpu"))
        for number, step in enumerate(steps, start=1):
            assert rows.canvas[0].tolist() == step["canvas_input"]
            result = entropy_bound_step(rows, logits[step["logits_key"]][None])
            assert bool(result.done[0]) == (number == len(steps))
        assert result.argmax[0].tolist() == _committed(run, index)


def test_a_rows_draws_do_not_depend_on_its_batch():
    """Two rows stepped together, at different steps of their canvases, draw what each draws alone."""
    logits = load_file(str(REFERENCE / "trace_logits.safetensors"))
    params = [
        EntropyBoundParams(max_denoising_steps=3, entropy_bound=0.5),
        EntropyBoundParams(entropy_bound=2.0),
    ]
    alone = []
    for row, param in enumerate(params):
        rows = start_canvas([param], [torch.Generator().manual_seed(7 + row)], 16, 256, torch.device("cpu"))
        rows.steps_taken += row  # the second row is one step further on
        alone.append((entropy_bound_step(rows, logits[f"step_{row}"][None]), rows.canvas))
    generators = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)]
    batch = start_canvas(params, generators, 16, 256, torch.device("cpu"))
    batch.steps_taken += torch.tensor([0, 1])
    together = entropy_bound_step(batch, torch.stack([logits["step_0"], logits["step_1"]]))
    for row, (result, canvas) in enumerate(alone):
        assert torch.equal(together.processed_logits[row], result.processed_logits[0])
        assert torch.equal(batch.canvas[row], canvas[0])
        assert together.done[row] == result.done[0]


@pytest.mark.parametrize(
    "run",
    RUNS,
    ids=[
        f"p{len(r['prompt_ids'])}-L{r['args']['canvas_length']}-S{r['args']['max_denoising_steps']}"
        f"-eb{r['args']['entropy_bound']}-eos{r['args']['eos_token_id']}"
        for r in RUNS
    ],
)
def test_generate_matches_reference(model, run):
    """A seeded single request, token for token and step for step: the reference's output less the pad
    it writes after an EOS."""
    args = run["args"]
    result = generate(
        model,
        run["prompt_ids"],
        max_new_tokens=args["max_new_tokens"],
        params=_params(args),
        seed=run["seed"],
        eos_token_ids=(args["eos_token_id"],),
        canvas_length=args["canvas_length"],
    )
    expected = run["output_ids"]
    assert result.tokens == expected[: len(result.tokens)]
    assert set(expected[len(result.tokens) :]) <= {args["pad_token_id"]}
    assert result.steps_per_canvas == run["steps_per_canvas"]
    assert result.finish_reason == ("eos" if args["eos_token_id"] in result.tokens else "length")


def test_the_reference_runs_cover_the_stops():
    """The vectors exercise what they claim: adaptive stops, step limits and EOS in a second canvas."""
    early = [r for r in RUNS if min(r["steps_per_canvas"]) < r["args"]["max_denoising_steps"]]
    assert any(r["args"]["stability_threshold"] > 0 for r in early) and any(
        r["args"]["stability_threshold"] == 0 for r in early
    )
    assert any(max(r["steps_per_canvas"]) == r["args"]["max_denoising_steps"] for r in RUNS)
    second = [
        r for r in RUNS if r["args"]["eos_token_id"] in _committed(r, 1) and len(r["steps_per_canvas"]) == 2
    ]
    assert len(second) >= 3


# --- config.json defaults -------------------------------------------------------------------------


def _dropped(case: dict) -> dict:
    raw = json.loads((REFERENCE / "config.json").read_text())
    parent = raw
    for key in (case["drop"] or [])[:-1]:
        parent = parent[key]
    if case["drop"]:
        del parent[case["drop"][-1]]
    parent.update(case.get("add", {}))
    return raw


def _resolved(raw: dict) -> dict:
    """Our reader's view, in the names of the reference's resolved config (config_defaults.json)."""
    config = diffusion_gemma_config(raw)
    rope = {
        kind: {
            "rope_type": spec.rope_type,
            "rope_theta": spec.theta,
            "partial_rotary_factor": spec.partial_rotary_factor,
        }
        for kind, spec in config.rope.items()
    }
    view = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": list(config.eos_token_ids),
        "bos_token_id": config.bos_token_id,
        "rope_parameters": rope,
        "attention_bias": config.attention_bias,
        "sliding_window": config.sliding_window,
        "layer_types": list(config.layer_types),
        "final_logit_softcapping": config.final_logit_softcapping,
        "use_bidirectional_attention": config.use_bidirectional_attention,
        "num_experts": config.num_experts,
        "top_k_experts": config.top_k_experts,
        "moe_intermediate_size": config.moe_intermediate_size,
        "layer_head_dims": list(config.layer_head_dims),
        "layer_kv_heads": list(config.layer_kv_heads),
    }
    resolved = {f"text.{name}": value for name, value in view.items()}
    for name in ("canvas_length", "tie_word_embeddings", "image_token_id", "boi_token_id", "eoi_token_id"):
        resolved[name] = getattr(config, name)
    return resolved


def _reference_view(resolved: dict) -> dict:
    view = dict(resolved)
    assert view.pop("text.hidden_activation") == "gelu_pytorch_tanh"
    eos = view["text.eos_token_id"]
    view["text.eos_token_id"] = eos if isinstance(eos, list) else [eos]
    for spec in view["text.rope_parameters"].values():
        spec.setdefault("partial_rotary_factor", 1.0)
    return view


@pytest.mark.parametrize(
    "case",
    DEFAULT_CASES,
    ids=["+".join(c["drop"] or ["none"]) + ("+add" if "add" in c else "") for c in DEFAULT_CASES],
)
def test_a_dropped_field_takes_the_reference_default(case):
    raw = _dropped(case)
    if "error" in case:  # the reference refuses it too
        with pytest.raises(ModelConfigError):
            diffusion_gemma_config(raw)
        return
    expected = _reference_view(case["resolved"])
    needed = [
        name
        for name in ("num_experts", "top_k_experts", "moe_intermediate_size")
        if expected[f"text.{name}"] is None
    ]
    if needed:  # the reference config accepts it, its model cannot be built without it
        with pytest.raises(ModelConfigError, match=needed[0]):
            diffusion_gemma_config(raw)
        return
    assert _resolved(raw) == expected


SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
FORWARD_FIELDS = (
    "rms_norm_eps",
    "final_logit_softcapping",
    "rope_parameters",
    "sliding_window",
    "layer_types",
)


@pytest.mark.parametrize(
    "case", [c for c in DEFAULT_CASES if "resolved" in c and c["drop"]], ids=lambda c: "+".join(c["drop"])
)
def test_a_checkpoint_with_a_dropped_field_loads_and_runs(tmp_path, model, case):
    """Where the default keeps the tensors' shapes, the checkpoint loads with it: the same logits where
    the forward's fields keep the checkpoint's values, other logits where the default changes one."""
    base = _reference_view(DEFAULT_CASES[0]["resolved"])
    expected = _reference_view(case["resolved"])
    shapes = ("text.layer_head_dims", "text.layer_kv_heads", *(f"text.{f}" for f in SHAPE_FIELDS))
    if any(expected[name] != base[name] for name in shapes) or None in (
        expected["text.num_experts"],
        expected["text.top_k_experts"],
        expected["text.moe_intermediate_size"],
    ):
        pytest.skip("the default changes the tensors' shapes or is refused: checked as a config only")
    same_forward = all(expected[f"text.{name}"] == base[f"text.{name}"] for name in FORWARD_FIELDS)
    directory = _checkpoint_with(tmp_path, _dropped(case))
    assert _first_logits(_load(directory)).equal(_first_logits(model)) == same_forward


def _checkpoint_with(tmp_path: Path, raw: dict, tensors: dict | None = None) -> Path:
    directory = tmp_path / "checkpoint"
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(raw))
    if tensors is None:
        shutil.copy(REFERENCE / "model.safetensors", directory / "model.safetensors")
    else:
        save_file(tensors, str(directory / "model.safetensors"))
    return directory


def _first_logits(model) -> torch.Tensor:
    cache = _cache_for(model, len(TRACE["run"]["prompt_ids"]))
    model.encode(torch.tensor([TRACE["run"]["prompt_ids"]]), cache)
    return model.denoise(torch.tensor([TRACE["steps"][0]["canvas_input"]]), cache)


# --- checkpoint layouts ---------------------------------------------------------------------------


def _tensors() -> dict[str, torch.Tensor]:
    with safe_open(str(REFERENCE / "model.safetensors"), framework="pt") as handle:
        return {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118


def test_the_checkpoint_has_a_vision_tower_that_is_skipped():
    assert any(key.startswith("model.encoder.vision_tower.") for key in _tensors())


@pytest.mark.parametrize("layout", ["untied", "tied-under-encoder-names"])
def test_other_checkpoint_layouts_give_the_same_logits(tmp_path, model, layout):
    """Untied (the encoder's own copies and an LM head), or tied but saved under the encoder's names."""
    raw, tensors = json.loads((REFERENCE / "config.json").read_text()), _tensors()
    shared = {
        k: v for k, v in tensors.items() if k.startswith("model.decoder.") and not k.endswith("layer_scalar")
    }
    encoder = {
        "model.encoder.language_model." + k.removeprefix("model.decoder."): v
        for k, v in shared.items()
        if not k.startswith("model.decoder.self_conditioning.")
    }
    if layout == "untied":
        raw["tie_word_embeddings"] = False
        tensors |= {name: value.clone() for name, value in encoder.items()}
        tensors["lm_head.weight"] = tensors["model.decoder.embed_tokens.weight"].clone()
    else:
        tensors = {k: v for k, v in tensors.items() if k not in shared or "self_conditioning" in k}
        tensors |= encoder
    loaded = _load(_checkpoint_with(tmp_path, raw, tensors))
    assert torch.equal(_first_logits(loaded), _first_logits(model))


def test_an_unknown_or_missing_tensor_is_refused(tmp_path):
    raw, tensors = json.loads((REFERENCE / "config.json").read_text()), _tensors()
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.decoder.extra'"):
        _load(_checkpoint_with(tmp_path / "extra", raw, {**tensors, "model.decoder.extra": torch.zeros(1)}))
    del tensors["model.decoder.layers.1.experts.down_proj"]
    with pytest.raises(CheckpointError, match="missing"):
        _load(_checkpoint_with(tmp_path / "missing", raw, tensors))


# --- multimodal and unsupported configurations ----------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda raw: raw.update(audio_config={"model_type": "gemma4_audio"}), "audio_config"),
        (
            lambda raw: raw["text_config"].update(use_bidirectional_attention="all"),
            "use_bidirectional_attention",
        ),
        (lambda raw: raw["text_config"].update(hidden_activation="silu"), "hidden_activation"),
        (lambda raw: raw.update(model_type="gemma4"), "model_type"),
    ],
)
def test_an_unsupported_config_is_refused_by_name(edit, named):
    raw = json.loads((REFERENCE / "config.json").read_text())
    edit(raw)
    with pytest.raises(ModelConfigError, match=named):
        diffusion_gemma_config(raw)


def test_multimodal_inputs_are_refused_by_name(model):
    with pytest.raises(MultimodalInputError, match="pixel_values"):
        refuse_multimodal_inputs({"input_ids": [1, 2], "pixel_values": None})
    refuse_multimodal_inputs({"input_ids": [1, 2]})
    original = model.config
    model.config = replace(original, image_token_id=200)  # an image token inside the tiny vocabulary
    try:
        with pytest.raises(MultimodalInputError, match="image_token_id=200"):
            generate(model, [5, 200, 7], max_new_tokens=4)
    finally:
        model.config = original
