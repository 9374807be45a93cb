"""Start ``dllm`` with glibc's transparent huge pages for large allocations (imports nothing heavy).

Every ``dllm`` command serves CPU tensors of 1 MiB and more from mmap (device_memory.py), so that peak
resident memory follows the batch shape the token budget is fitted to. Each such tensor then costs
page faults on 4 KiB pages, which a batched forward pays for on every activation: measured on the
shipped model, 64 rows of 74 tokens took 61 us per position against 40 us from the heap. With
``glibc.malloc.hugetlb=1`` (glibc 2.35 and later; ignored by others) glibc asks for huge pages on those
mappings: 39 us per position, and peaks still follow the shape. The setting is read only when a process
starts, so the command starts itself once more with it (``DLLM_NO_HUGE_PAGES=1``: do not).
"""

from __future__ import annotations

import os
import runpy
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "DLLM_NO_HUGE_PAGES"
MAIN = ("-m", "engine_pod.cli.main")  # what the console script runs


def restart_with_huge_pages(module_argv: list[str]) -> None:
    """Replace this process with ``python <module_argv>`` under the tunable, unless it is set already
    (or opted out of, or this is not Linux). Returns only when nothing was to be done."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if sys.platform != "linux" or "glibc.malloc.hugetlb" in tunables or os.environ.get(OPT_OUT) == "1":
        return
    env = dict(os.environ, GLIBC_TUNABLES=":".join(filter(None, (tunables, TUNABLE))))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *module_argv], env)


def run() -> None:
    """The ``dllm`` console script: ``python -m engine_pod.cli.main`` under the tunable, the module run as
    the restart runs it (by name: this launcher imports nothing of the command)."""
    restart_with_huge_pages([*MAIN, *sys.argv[1:]])
    runpy.run_module(MAIN[1], run_name="__main__", alter_sys=True)
