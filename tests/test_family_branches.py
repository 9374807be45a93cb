"""No code outside the family registry and the families' own modules asks for a family by name: the
engine, gateway, operator and contracts read a family's record (engine_pod/families/registry.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from engine_pod.families.registry import registered_families

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("engine_pod", "gateway", "operator/dllm_operator", "dllm_contracts")
# the families' modules, and the table scripts/generate_family_tables.py writes from the registry
ALLOWED = ("engine_pod/families/", "dllm_contracts/family_table.py")


def family_words() -> set[str]:
    """Every family's name and the model_types it reads, in lower case."""
    return {word for family in registered_families() for word in (family.name, *family.model_types)}


def _family_classes() -> set[str]:
    """Classes defined in the families' modules (a config or model class that isinstance could branch on)."""
    names = set()
    for path in (ROOT / "engine_pod" / "families").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    return names - {"ModelFamily", "DualCacheQuirks"}  # the record's own types are the contract


def _checkpoint_data(tree: ast.AST) -> set[int]:
    """ids of constants that are a ``"model_type": ...`` entry's value: a checkpoint's config as data."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "model_type":
                    ids.add(id(value))
    return ids


def family_branches(source: str, words: set[str], classes: set[str]) -> list[str]:
    """Where ``source`` names a family: a string equal to a family's name or model_type (outside
    checkpoint data), or an isinstance check against a family's class."""
    tree = ast.parse(source)
    data = _checkpoint_data(tree)
    found = []
    for node in ast.walk(tree):
        named = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in words
        if named and id(node) not in data:
            found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            named = (
                {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} if node.args[1:] else set()
            )
            found += [f"line {node.lineno}: isinstance(..., {name})" for name in sorted(named & classes)]
    return found


def test_no_product_code_outside_the_families_branches_on_a_family():
    words, classes = family_words(), _family_classes()
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(ALLOWED):
                found += [
                    f"{relative} {where}" for where in family_branches(path.read_text(), words, classes)
                ]
    assert not found, "family-name branches outside engine_pod/families/:\n" + "\n".join(found)


def test_the_scan_finds_a_planted_branch_of_each_kind():
    """The scan can fail: a comparison, a set and an isinstance planted in a snippet are each found,
    while a checkpoint's config data is not a branch."""
    words, classes = family_words(), _family_classes()
    planted = (
        'if config.family == "sdar":\n    pass\n'
        'CAPPED = frozenset({"llada2"})\n'
        "if isinstance(config, DiffusionGemmaConfig):\n    pass\n"
        'RAW = {"model_type": "llada", "d_model": 64}\n'
    )
    found = family_branches(planted, words, classes)
    assert sorted(found) == [
        "line 1: 'sdar'",
        "line 3: 'llada2'",
        "line 4: isinstance(..., DiffusionGemmaConfig)",
    ]
