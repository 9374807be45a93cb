"""`dllm generate`: output shape, EOS handling, and one-line errors with a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine_pod.cli.main import main
from tests.engine_pod.test_reference_fidelity import run_generate
from tests.factories import REFERENCE_DIR, llada_config, write_checkpoint

LLADA = REFERENCE_DIR / "llada"


def _error_of(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gen-length", "60", "--block-length", "32"], "does not divide"),
        (["--gen-length", "64", "--block-length", "32", "--steps", "3"], "multiple of the number of blocks"),
        (["--threshold", "1.5"], "threshold must be in"),
        (["--prompt-ids", "1,x"], "comma-separated integers"),
        (["--prompt-ids", "99999"], "outside the vocabulary"),
        (["--dtype", "int8"], "unknown dtype"),
        (["--device", "cuda"], "CUDA is not available"),
        (["--device", "tpu"], "device"),
    ],
)
def test_bad_arguments_fail_with_one_line(capsys, argv, message):
    base = ["generate", "--model", str(LLADA), "--prompt-ids", "1,2,3"]
    assert message in _error_of(capsys, base + argv)


def test_missing_model_and_unknown_type(capsys, tmp_path):
    assert "does not exist" in _error_of(
        capsys, ["generate", "--model", str(tmp_path / "nope"), "--prompt-ids", "1"]
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert "unknown model_type" in _error_of(
        capsys, ["generate", "--model", str(tmp_path), "--prompt-ids", "1"]
    )
    (tmp_path / "config.json").write_text(json.dumps(llada_config()))
    assert "model.safetensors" in _error_of(
        capsys, ["generate", "--model", str(tmp_path), "--prompt-ids", "1"]
    )


def test_text_prompt_without_tokenizer_is_a_clear_error(capsys):
    assert "no tokenizer" in _error_of(capsys, ["generate", "--model", str(LLADA), "--prompt", "hello"])


def test_hub_id_offline_fails_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "Hugging Face Hub" in _error_of(
        capsys, ["generate", "--model", "GSAI-ML/LLaDA-8B-Instruct", "--prompt-ids", "1"]
    )


def test_eos_stops_at_block_boundary_and_fills(tmp_path):
    model_dir = write_checkpoint(tmp_path / "m", llada_config(), seed=3)
    options = ["--gen-length", "64", "--block-length", "16", "--steps", "64", "--remasking", "low_confidence"]
    free = run_generate(model_dir, [5, 6, 7], options)["token_ids"]
    # declare a token the model produces in its second block to be EOS: generation stops after that block
    eos = free[20]
    raw = llada_config(eos=eos)
    (model_dir / "config.json").write_text(json.dumps(raw))
    argv = ["generate", "--model", str(model_dir), "--prompt-ids", "5,6,7", *options, "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "engine_pod.cli.main", *argv], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout)
    first_eos = free.index(eos)
    stop_block_end = (first_eos // 16 + 1) * 16
    assert result["token_ids"][:stop_block_end] == free[:stop_block_end]
    assert result["token_ids"][stop_block_end:] == [eos] * (64 - stop_block_end)
    assert result["finish_reason"] == "stop"
    assert result["completion_tokens"] == first_eos + 1
    assert result["num_forward_passes"] == (stop_block_end // 16) * 16


def test_family_refuses_a_checkpoint_of_another_family_in_one_line_and_runs_its_own():
    argv = [sys.executable, "-m", "engine_pod.cli.main", "generate", "--model", "builtin:tiny-llada"]
    argv += ["--prompt-ids", "5,6,7", "--gen-length", "8", "--block-length", "8", "--json"]
    refused = subprocess.run([*argv, "--family", "dream"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "dllm generate: error: builtin:tiny-llada is a llada checkpoint, not the dream one expected "
        "(--family dream, a DLLMService's spec.model.family): name its family, or another model"
    ]
    served = subprocess.run([*argv, "--family", "llada"], capture_output=True, text=True, timeout=300)
    assert served.returncode == 0, served.stderr[-2000:]
    assert json.loads(served.stdout)["completion_tokens"] >= 1
