"""The promtool binary the alert rules' tests run (Prometheus' own rule checker and unit tester):
``$DLLM_PROMTOOL`` or one on PATH (Debian's ``prometheus`` package has it; ``.ci/run`` installs it). Without
one, a test that needs it fails under CI (``CI`` set, as CI sets it), so that the rules are never left
untested there, and is skipped with the reason on a machine without it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = "apt-get install --no-install-recommends prometheus (Debian), or set DLLM_PROMTOOL to a promtool"


def promtool_binary() -> str:
    """A runnable promtool; fails (CI) or skips (elsewhere) the calling test when there is none."""
    for candidate in (os.environ.get("DLLM_PROMTOOL"), shutil.which("promtool")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    reason = f"no promtool to evaluate the alert rules with: {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool_binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
