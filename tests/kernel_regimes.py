"""The matrix-library kernel regimes a CPU can be made to run, for tests that batch invariance does not
lean on the kernels: MKL's own code paths (``MKL_CBWR``) and MKL's Intel kernels forced on any x86 CPU (a
preloaded shim answers MKL's vendor check, so an AMD machine runs what an Intel one runs; on an Intel
machine it changes nothing)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

INTEL_CHECK_SHIM = """
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
int mkl_serv_cpuiszen(void) { return 0; }
"""

MKL_PATHS = {
    "default": {},
    "mkl-vendor-neutral": {"MKL_CBWR": "COMPATIBLE"},
    "mkl-avx2": {"MKL_CBWR": "AVX2"},
}
REGIMES = (*MKL_PATHS, "mkl-intel-kernels")


def require_mkl_on_x86() -> None:
    """Skip where the regimes do not exist: torch without MKL, or not an x86 CPU."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkl.is_available():
        pytest.skip("the kernel regimes are MKL's, on x86 CPUs")


def intel_kernels_env(build_dir: Path) -> dict[str, str]:
    """The environment that forces MKL's Intel kernels: the shim, compiled once into ``build_dir``. No C
    compiler: a skip, except in CI (CI=true), where it fails."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler to build the Intel-kernels shim (CI needs one: gcc)")
        pytest.skip("no C compiler (cc or gcc) to build the Intel-kernels shim")
    library = build_dir / "libintel_kernels.so"
    if not library.exists():
        source = build_dir / "intel_kernels.c"
        source.write_text(INTEL_CHECK_SHIM)
        subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    preload = " ".join(filter(None, [str(library), os.environ.get("LD_PRELOAD", "")]))
    return {"LD_PRELOAD": preload}


def regime_env(regime: str, build_dir: Path) -> dict[str, str]:
    """This process's environment with ``regime`` in force and one torch thread."""
    extra = intel_kernels_env(build_dir) if regime == "mkl-intel-kernels" else MKL_PATHS[regime]
    env = {key: value for key, value in os.environ.items() if key != "MKL_CBWR"}
    return {**env, **extra, "DLLM_TEST_THREADS": "1", "OMP_NUM_THREADS": "1"}
