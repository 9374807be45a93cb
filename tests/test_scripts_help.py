"""Every script in scripts/ answers ``--help`` with its usage and exit status 0, and does no work: a user
who asks a script what it does must not start a benchmark, a build or a cluster (nor see a crash)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.doc_commands import ROOT

SCRIPTS = sorted(p for p in (ROOT / "scripts").iterdir() if p.suffix in {".sh", ".py"})
# a hang guard, not a speed bound: a Python script may import torch and transformers before it parses its
# arguments (one took 48 s on two cores other work kept busy)
HELP_SECONDS = 300


def _status() -> str:
    """What git sees changed in the working tree (a script that ran would leave files behind)."""
    done = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout


def test_there_are_scripts_of_both_kinds():
    assert {p.suffix for p in SCRIPTS} == {".sh", ".py"} and len(SCRIPTS) > 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_answers_help_with_its_usage(script):
    program = ["bash"] if script.suffix == ".sh" else [sys.executable]
    before = _status()
    done = subprocess.run(
        [*program, str(script), "--help"],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=HELP_SECONDS,
    )
    assert done.returncode == 0, f"{script.name} --help: exit {done.returncode}: {done.stderr[-1000:]}"
    assert "usage:" in done.stdout.lower(), f"{script.name} --help printed no usage line: {done.stdout[:500]}"
    assert _status() == before, f"{script.name} --help changed the working tree"
