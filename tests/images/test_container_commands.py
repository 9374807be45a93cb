"""The commands the operator puts in containers exist and start (images cannot be built here: no Docker
engine; these run the same entry points from the installed package)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.serving_utils import write_served_model

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=120)


def test_engine_commands_have_the_flags_the_operator_passes():
    from dllm_operator.config import OperatorSettings
    from dllm_operator.manifests.engine import EnginePods
    from dllm_operator.manifests.engine_group import engine_workload
    from dllm_operator.manifests.profiling import profiling_job

    from tests.operator.test_manifests import OWNER, example

    spec, settings = example(), OperatorSettings()
    worker = engine_workload(spec, OWNER, EnginePods(settings, "redis://r:6379/0", "h"), 1)["spec"][
        "template"
    ]["spec"]
    profile = profiling_job(spec, OWNER, settings, "h")["spec"]["template"]["spec"]
    for command in (worker["containers"][0]["command"], profile["containers"][0]["command"]):
        assert command[0] == "dllm"
        helped = run(sys.executable, "-m", "engine_pod.cli.main", command[1], "--help")
        assert helped.returncode == 0, helped.stderr
        for flag in (arg for arg in command[2:] if arg.startswith("--")):
            assert re.search(rf"{re.escape(flag)}\b", helped.stdout), f"dllm {command[1]} has no {flag}"


def test_gateway_and_tokenizer_fetch_entry_points(tmp_path):
    model = write_served_model(tmp_path / "model")
    fetched = run(sys.executable, "-m", "gateway.fetch_tokenizer", str(model), str(tmp_path / "tok"))
    assert fetched.returncode == 0, fetched.stderr
    assert (tmp_path / "tok" / "tokenizer.json").is_file() and not (
        tmp_path / "tok" / "model.safetensors"
    ).exists()
    assert run(sys.executable, "-m", "gateway", "--help").returncode == 0
    missing = run(
        sys.executable, "-m", "gateway.fetch_tokenizer", str(tmp_path / "nope"), str(tmp_path / "x")
    )
    assert missing.returncode == 1 and "error" in missing.stderr


def test_dockerfiles_run_the_same_entry_points_as_a_user_from_a_small_final_stage():
    for image, command in (
        ("engine", '"dllm"'),
        ("gateway", '"-m", "gateway"'),
        ("operator", '"-m", "dllm_operator"'),
    ):
        text = (ROOT / "docker" / f"{image}.Dockerfile").read_text()
        final = text.rsplit("\nFROM ", 1)[1]  # the stage that becomes the image
        assert " AS build" in text and "COPY --from=build /opt/venv /opt/venv" in final, image
        assert "pip install" not in final and "USER 10001" in final, image  # no build tools, not root
        assert command in final.splitlines()[-1], image
