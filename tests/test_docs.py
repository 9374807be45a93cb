"""README.md and docs/: every link resolves (files and headings inside the repository), and the text speaks
to users (no issue numbers or dated lab notes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.DOTALL)


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(path: Path) -> set[str]:
    text = CODE.sub("", path.read_text())
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _links(path: Path) -> list[str]:
    return LINK.findall(CODE.sub("", path.read_text()))


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(document):
    for link in _links(document):
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        target, _, anchor = link.partition("#")
        resolved = (document.parent / target).resolve() if target else document
        assert resolved.is_relative_to(ROOT), f"{document.name}: {link} points outside the repository"
        assert resolved.exists(), f"{document.name}: {link} does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{document.name}: {link}: no such heading"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_text_speaks_to_users(document):
    text = document.read_text()
    for pattern in (r"\bissues? #?\d+\b", r"\b20\d\d-\d\d-\d\d\b", r"measured again", r"later that day"):
        assert not re.search(pattern, text, re.IGNORECASE), f"{document.name}: {pattern}"


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def _section(document: Path, heading: str) -> str:
    return document.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_readmes_commands_table_lists_every_dllm_command():
    from engine_pod.cli.main import build_parser

    parser = build_parser()
    commands = set(next(a for a in parser._actions if a.dest == "command").choices)
    rows = re.findall(r"^\| `dllm (\w+)", _section(ROOT / "README.md", "Commands"), re.MULTILINE)
    assert commands <= set(rows), f"README's commands table lacks {sorted(commands - set(rows))}"


def test_readme_names_every_random_preset():
    from engine_pod.loading.presets import PRESETS

    text = (ROOT / "README.md").read_text()
    missing = [name for name in PRESETS if f"`random:{name}`" not in text]
    assert not missing, f"README's --model paragraph lacks {missing}"


def test_readme_and_the_package_summary_name_every_family():
    import tomllib

    from dllm_contracts.families import FAMILY_NAMES

    readme = (ROOT / "README.md").read_text().split("\n\n")[1]  # the paragraph under the title
    summary = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    for text in (readme, summary):
        missing = [name for name in FAMILY_NAMES.values() if not re.search(rf"\b{re.escape(name)}\b", text)]
        assert not missing, f"{text[:60]!r}... lacks {missing}"
