"""The engine's layout: small files, no import cycle between its files or between its rooms (a folder of
``engine_pod``, or a module at its top), so every room stands above the rooms it uses; and the worker and
the scheduler know no model family (a new family touches its model, its config reader and its cache
layout, never them). Every import counts, a function's deferred one included."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layout import ROOT, imported_modules

ENGINE = ROOT / "engine_pod"
MAX_LINES = 300
FAMILY_AGNOSTIC = {  # room -> the engine modules it may import from the rooms below it that know families
    "worker": {"engine_pod.runner.contract"},
    "scheduler": set(),
}
FAMILY_ROOMS = (
    "engine_pod.models",
    "engine_pod.families",
    "engine_pod.loading",
    "engine_pod.kinds",
    "engine_pod.runner",
    "engine_pod.profiling",
)


def engine_modules() -> dict[str, Path]:
    modules = {}
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def engine_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The engine modules ``path`` imports (``from package import module`` names the module)."""
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            named = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
            found |= named or {node.module}
    found |= {m for m in imported_modules(path.read_text()) if m in modules}
    return found


def room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def module_graph() -> dict[str, set[str]]:
    modules = engine_modules()
    return {name: engine_imports(path, modules) - {name} for name, path in modules.items()}


def test_no_engine_file_is_longer_than_its_bound():
    long = {
        str(p.relative_to(ROOT)): n
        for p in ENGINE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long


def test_no_import_cycle_between_engine_files():
    assert not cycles(module_graph())


def test_no_import_cycle_between_engine_rooms():
    rooms: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        rooms.setdefault(room_of(module), set()).update(room_of(m) for m in imported)
    assert not cycles({room: targets - {room} for room, targets in rooms.items()})


def test_the_worker_and_the_scheduler_know_no_model_family():
    graph = module_graph()
    for room, allowed in FAMILY_AGNOSTIC.items():
        prefix = f"engine_pod.{room}"
        reached = {m for module, imported in graph.items() if module.startswith(prefix) for m in imported}
        knows = {m for m in reached if m.startswith(FAMILY_ROOMS) and m not in allowed}
        assert not knows, room


KIND_ROOMS = ("engine_pod.kinds", "engine_pod.families")  # what differs by cache kind or family


def kind_imports(graph: dict[str, set[str]], room: str = "engine_pod.runner") -> set[str]:
    """What the modules of ``room`` import from the kinds' folders or the families."""
    return {m for module, imported in graph.items() if module.startswith(room) for m in imported} & {
        m for m in graph if m.startswith(KIND_ROOMS)
    }


def test_the_runner_holds_only_what_every_kind_shares():
    """``runner/`` (the cycle driver, the runner contract, the factory, the interfaces, tensor parallelism)
    imports no cache kind's folder and no family: a kind's code lives in ``engine_pod/kinds/``, and the
    family's record names its kind."""
    assert not kind_imports(module_graph())


def test_the_kind_scan_finds_a_runner_that_imports_a_kind():
    graph = module_graph()
    graph["engine_pod.runner.factory"] = graph["engine_pod.runner.factory"] | {
        "engine_pod.kinds.canvas.stepper"
    }
    assert kind_imports(graph) == {"engine_pod.kinds.canvas.stepper"}


def test_the_cycle_finder_finds_a_cycle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
