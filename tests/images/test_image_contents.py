"""The images hold the tested set: every version a Dockerfile or an image's requirement file names is the
one constraints.txt pins, every install is constrained by it, and every module an image's command can
import is installed in that image (images cannot be built here: this reads what they would contain)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
OURS = {
    "dllm_contracts": ROOT / "dllm_contracts",
    "engine_pod": ROOT / "engine_pod",
    "gateway": ROOT / "gateway",
    "dllm_operator": ROOT / "operator" / "dllm_operator",
}
PIN = re.compile(r"(?<![\w.-])([A-Za-z][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)")
# image -> (its requirement file, or None for the engine's, which installs the project with extras;
#           the modules its container commands run)
IMAGES = {
    "engine": (None, ["engine_pod.cli.main", "dllm_contracts.fetch_model"]),
    "gateway": ("gateway-requirements.txt", ["gateway.__main__", "gateway.fetch_tokenizer"]),
    "operator": ("operator-requirements.txt", ["dllm_operator.handlers"]),
}


def pins() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    return {canonicalize_name(n): v for n, v in PIN.findall(text)}


def named_versions(text: str) -> list[tuple[str, str]]:
    """Every ``name==version`` a Dockerfile or requirement file names, and its ``ARG TORCH_VERSION``."""
    found = [(canonicalize_name(n), v) for n, v in PIN.findall(text)]
    found += [("torch", v) for v in re.findall(r"ARG TORCH_VERSION=(\S+)", text)]
    return found


def version_mismatches(text: str, pinned: dict[str, str]) -> list[str]:
    return [
        f"{n}=={v} (constraints.txt: {pinned.get(n)})" for n, v in named_versions(text) if pinned.get(n) != v
    ]


@pytest.mark.parametrize("path", sorted(DOCKER.glob("*")), ids=lambda p: p.name)
def test_every_version_an_image_names_is_the_pinned_one(path):
    assert not version_mismatches(path.read_text(), pins())


def test_a_dockerfile_whose_torch_differs_from_the_pin_is_caught():
    engine = (DOCKER / "engine.Dockerfile").read_text()
    assert ("torch", pins()["torch"]) in named_versions(engine)  # the engine names its torch
    drifted = re.sub(r"ARG TORCH_VERSION=\S+", "ARG TORCH_VERSION=2.5.1", engine)
    assert version_mismatches(drifted, pins()) == [f"torch==2.5.1 (constraints.txt: {pins()['torch']})"]


@pytest.mark.parametrize("image", IMAGES)
def test_every_install_is_constrained_and_no_torch_where_none_belongs(image):
    dockerfile = (DOCKER / f"{image}.Dockerfile").read_text()
    for line in re.findall(r"RUN pip install[^\n]*", dockerfile):
        torch_index = "--index-url" in line and "torch==" in line
        assert "-c constraints.txt" in line or "--no-deps" in line or torch_index, line
    requirements, _ = IMAGES[image]
    if requirements:
        lines = [
            ln for ln in (DOCKER / requirements).read_text().splitlines() if ln and not ln.startswith("#")
        ]
        assert all(PIN.fullmatch(ln.strip()) for ln in lines), "every requirement is pinned exactly"
        assert "torch" not in installed(image)


def _requirements(name: str, extras: set[str] = frozenset()) -> list[Requirement]:
    out = []
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
            out.append(requirement)
    return out


def _closure(roots: list[Requirement]) -> set[str]:
    """The distributions ``roots`` install, with their dependencies (as this environment resolved them)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        if name == "dllm-serve":  # the project itself: installed from the source tree
            todo += _requirements(name, set(requirement.extras))
            continue
        try:
            todo += _requirements(requirement.name, set(requirement.extras))
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform (this environment did not install it)
    return seen


def installed(image: str) -> set[str]:
    requirements, _ = IMAGES[image]
    if requirements is None:  # torch, then the project with [serve]
        roots = [Requirement("torch"), Requirement("dllm-serve[serve]")]
    else:
        lines = (DOCKER / requirements).read_text().splitlines()
        roots = [Requirement(ln) for ln in lines if ln and not ln.startswith("#")]
    return _closure(roots) | {"dllm-serve"}


def _module_file(module: str) -> Path | None:
    top, _, rest = module.partition(".")
    base = OURS.get(top)
    if base is None:
        return None
    path = base.joinpath(*rest.split(".")) if rest else base
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _optional(node: ast.AST, parents: dict) -> bool:
    """An import inside ``try: ... except ImportError`` or ``if TYPE_CHECKING:`` (not needed to run)."""
    while node in parents:
        node, child = parents[node], node
        if (
            isinstance(node, ast.Try)
            and child in node.body
            and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers
            )
        ):
            return True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and not _optional(node, parents):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not _optional(node, parents):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def imported_packages(entry_modules: list[str]) -> set[str]:
    """Top-level third-party packages that the entry modules and every module of ours they reach import
    (anywhere in a file: a function's lazy import runs when the command does)."""
    seen, third_party, todo = set(), set(), list(entry_modules)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module)
        if path is None or not path.is_file():
            continue
        for name in _imports(path, module):
            top = name.split(".")[0]
            if top in OURS:
                todo.append(name)
            elif top and top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return third_party


@pytest.mark.parametrize("image", IMAGES)
def test_every_module_the_images_command_imports_is_installed_in_it(image):
    providers = metadata.packages_distributions()
    contents = installed(image)
    _, entry_modules = IMAGES[image]
    missing = {
        top: providers.get(top)
        for top in imported_packages(entry_modules)
        if not {canonicalize_name(d) for d in providers.get(top, [top])} & contents
    }
    assert not missing, f"the {image} image lacks what its command imports: {missing}"


def test_the_closure_sees_an_import_the_image_lacks():
    """The check itself: the gateway image has no torch, so a gateway module importing it would fail."""
    assert "torch" in imported_packages(["engine_pod.cli.main"])
    assert "torch" not in imported_packages(["gateway.__main__", "gateway.fetch_tokenizer"])
    assert "torch" not in installed("gateway") and "torch" in installed("engine")
