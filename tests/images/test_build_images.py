"""scripts/build-images.sh, with a stand-in for docker that records what it is asked (no container engine
runs here): three builds from the tested set, tagged for the registry, pushed when asked, and the helm
line that uses them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    bin_dir, log = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "docker").chmod(0o755)
    env = os.environ | {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin"}
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_three_images_built_from_the_pins_tagged_pushed_and_the_helm_line_printed(tmp_path):
    done, calls = _run(tmp_path, "--registry", "registry.example.com:5000/team/", "--push")
    assert done.returncode == 0, done.stderr
    torch = next(
        line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.startswith("torch==")
    )
    builds = [c for c in calls if c.startswith("build ")]
    assert [b.split(" -t ")[1].split()[0] for b in builds] == [
        f"registry.example.com:5000/team/dllm-{image}:0.1.0" for image in ("operator", "engine", "gateway")
    ]
    assert f"TORCH_VERSION={torch.split('==')[1]}" in builds[1]
    assert [c for c in calls if c.startswith("push ")] == [
        f"push registry.example.com:5000/team/dllm-{image}:0.1.0"
        for image in ("operator", "engine", "gateway")
    ]
    assert "--set image.registry=registry.example.com:5000/team --set image.tag=0.1.0" in done.stdout


def test_usage_and_mistakes(tmp_path):
    helped, _ = _run(tmp_path, "--help")
    assert helped.returncode == 0 and "--registry REGISTRY" in helped.stdout
    missing, calls = _run(tmp_path, "--tag", "x")
    assert missing.returncode == 2 and "--registry is required" in missing.stderr and calls == []
    unknown, _ = _run(tmp_path, "--registry", "r", "--flag")
    assert unknown.returncode == 2 and "unknown argument --flag" in unknown.stderr
