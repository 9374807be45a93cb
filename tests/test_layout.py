"""Who may import whom: the gateway and the operator never import the engine (``engine_pod``); what they
share with it lives in ``dllm_contracts``, which imports none of them and no torch. Every import counts,
a function's deferred one included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {  # package directory -> top-level modules it must never import
    "gateway": {"engine_pod", "torch"},
    "operator": {"engine_pod", "torch"},
    "dllm_contracts": {"engine_pod", "gateway", "dllm_operator", "torch"},
}


def imported_modules(source: str) -> set[str]:
    """Every module an import statement in ``source`` names (absolute imports; relative ones are the
    package's own)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def forbidden_imports(directory: str) -> list[str]:
    found = []
    for path in sorted((ROOT / directory).rglob("*.py")):
        for module in sorted(imported_modules(path.read_text())):
            if module.partition(".")[0] in FORBIDDEN[directory]:
                found.append(f"{path.relative_to(ROOT)}: {module}")
    return found


@pytest.mark.parametrize("directory", sorted(FORBIDDEN))
def test_no_package_imports_what_it_must_not(directory):
    assert (ROOT / directory).is_dir()
    assert not forbidden_imports(directory)


def test_the_scan_sees_deferred_and_from_imports():
    source = "import os\nfrom engine_pod.queue import ops\n\ndef f():\n    import engine_pod.text as t\n"
    assert imported_modules(source) == {"os", "engine_pod.queue", "engine_pod.text"}
