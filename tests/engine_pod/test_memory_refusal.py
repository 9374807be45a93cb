"""A model whose weights cannot fit in the device's memory is refused before any is allocated, in one
line naming both sizes, with a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine_pod.cli.main import main
from engine_pod.device_memory import total_memory
from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.loader import build_model, parameter_count
from engine_pod.loading.presets import preset


@pytest.mark.parametrize("name", ["llada-tiny", "llada2-tiny"])
def test_the_count_is_the_built_models(name):
    config = config_from_dict(preset(name))
    model = build_model(config, torch.device("meta"), torch.float32)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


def test_a_model_larger_than_the_device_is_refused_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr("engine_pod.device_memory.total_memory", lambda device: 2**30)
    argv = ["generate", "--model", "random:llada2-mini", "--prompt-ids", "1,2,3", "--gen-length", "32"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "60.6 GiB in float32" in err[0] and "1.0 GiB of memory on cpu" in err[0]


def test_dllm_generate_refuses_llada2_mini_on_this_machine():
    """The product path: the real command, the real device's memory (the machine needs less than the
    weights in float64, 121 GiB, for the refusal to be the answer)."""
    needed = parameter_count(config_from_dict(preset("llada2-mini"))) * 8
    if total_memory(torch.device("cpu")) >= needed:
        pytest.skip("this machine could hold LLaDA2.0-mini's weights")
    argv = ["generate", "--model", "random:llada2-mini", "--dtype", "float64", "--prompt-ids", "1,2,3"]
    argv += ["--gen-length", "32"]
    done = subprocess.run(
        [sys.executable, "-m", "engine_pod.cli.main", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "121.1 GiB in float64" in lines[0], done.stderr
