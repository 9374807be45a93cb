"""Write every list of model families from the engine's family registry (engine_pod/families/registry.py).

    PYTHONPATH=. python scripts/generate_family_tables.py          # rewrite what differs
    PYTHONPATH=. python scripts/generate_family_tables.py --check  # write nothing; exit 1 if any differs

What it writes, each from the registry's records in their order (the first is the default family):
dllm_contracts/family_table.py (the torch-free table the operator, the gateway and the op census's grid
read, with the per-request settings each family adds, which the gateway takes as request fields); in both
copies of the DLLMService CRD, spec.model.family's enum, default and description, the per-family defaults
in the CEL rules and in the descriptions of decoding.blockLength and decoding.stepsPerBlock, and the
families the rule on parallelism.expert admits; the chart's values.yaml supportedFamilies and
values.schema.json's family enums; README.md's list of families and its Models table, the package
summary's list in pyproject.toml, and docs/models.md's list of --family names. Only those lines change:
the rest of each file stays as written. Run it after adding, removing or changing a family.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TABLE = "dllm_contracts/family_table.py"
CRDS = ("crds/dllmservices.dllm.dev.yaml", "charts/dllm-operator/crds/dllmservices.dllm.dev.yaml")
VALUES = "charts/dllm-operator/values.yaml"
VALUES_SCHEMA = "charts/dllm-operator/values.schema.json"
README = "README.md"
PYPROJECT = "pyproject.toml"
MODELS_DOC = "docs/models.md"
FILES = (TABLE, *CRDS, VALUES, VALUES_SCHEMA, README, PYPROJECT, MODELS_DOC)
# a family name is a CEL string, a YAML flow item and a CRD field of at most 32 characters
FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")

log = logging.getLogger("generate_family_tables")


class GenerationError(Exception):
    """A file lacks a region this script writes, or the registry holds what the files cannot say."""


@dataclass(frozen=True)
class FamilyRow:
    """What the generated files say of one family."""

    name: str
    display_name: str
    summary: str
    block_length: int
    steps_per_block: int
    kind: (
        str  # its cache kind's name: bidirectional (LLaDA, Dream), block_causal or canvas (engine_pod/kinds/)
    )
    checkpoints: str  # the published checkpoints it reads (README's Models table)
    tiny_preset: str  # its CPU-sized random preset (dllm_contracts/model_presets.py): the op census runs it
    expert_parallel: bool = False  # a mixture of experts that parallelism.expert spreads over ranks
    model_types: tuple[str, ...] = ()  # the config.json model_types it reads
    default_context: int | None = None  # its context where a config names none (the gateway's prompt limit)
    request_settings: tuple[dict[str, Any], ...] = ()  # the per-request settings it adds (Setting.to_row)


def registry_rows() -> tuple[FamilyRow, ...]:
    """The registry's families (imports the engine, and with it torch); a family whose tiny preset is not a
    preset of its own is refused."""
    from dllm_contracts.model_presets import PRESETS
    from dllm_contracts.request_setting import settings_of
    from engine_pod.families.registry import family_for_model_type, registered_families

    for f in registered_families():
        preset = PRESETS.get(f.tiny_preset)
        if preset is None or family_for_model_type(preset.get("model_type")).name != f.name:
            raise GenerationError(
                f"family {f.name}: its tiny_preset {f.tiny_preset!r} is no preset of model_type "
                f"{' or '.join(f.model_types)} in dllm_contracts/model_presets.py"
            )
    return tuple(
        FamilyRow(
            f.name,
            f.display_name,
            f.summary,
            f.decoding.block_length,
            f.decoding.steps_per_block,
            f.kind.name,
            f.checkpoints,
            f.tiny_preset,
            f.expert_parallel,
            tuple(f.model_types),
            _default_context(PRESETS[f.tiny_preset]),
            tuple(s.to_row() for s in settings_of(f.request_params).values()) if f.request_params else (),
        )
        for f in registered_families()
    )


def _default_context(preset: dict) -> int:
    """The context the engine's reader fills in for a config of this family that names none."""
    from engine_pod.loading.config_readers import config_from_dict

    names = ("max_position_embeddings", "max_sequence_length", "n_positions")
    bare = {k: v for k, v in preset.items() if k not in names}
    if "text_config" in preset:
        bare["text_config"] = {k: v for k, v in preset["text_config"].items() if k not in names}
    return config_from_dict(bare).max_position_embeddings


def check_rows(rows: Sequence[FamilyRow]) -> None:
    if not rows:
        raise GenerationError("the registry holds no family")
    for row in rows:
        if not FAMILY_NAME.fullmatch(row.name):
            raise GenerationError(f"family name {row.name!r} is not lower case letters, digits and _ (<= 32)")
        if row.kind not in KIND_WORDS:
            raise GenerationError(f"family {row.name}: cache kind {row.kind!r} has no words in KIND_WORDS")
        if "|" in row.checkpoints or ")" in row.display_name:
            raise GenerationError(f"family {row.name}: its checkpoints or display name cannot go in a table")
    declared: dict[str, dict[str, Any]] = {}
    for row in rows:
        for item in row.request_settings:
            if declared.setdefault(item["name"], item) != item:
                raise GenerationError(
                    f"two families declare the request setting {item['name']!r} differently"
                )


# dllm_contracts/family_table.py

TABLE_HEAD = '''\
# Generated by scripts/generate_family_tables.py from the engine's family registry
# (engine_pod/families/registry.py). Do not edit: change the family's record and run the script.
"""Every model family, in the registry's order (the first is the default), with the decoding it starts
from when a service does not say, its cache kind (what dllm_contracts/run_rules.py judges by), its
CPU-sized random preset (what the op census runs: engine_pod/bench/census_grid.py), whether its
experts spread over ranks (parallelism.expert) and the per-request settings it adds
(dllm_contracts/request_params.py reads them: the gateway's request fields)."""

from __future__ import annotations

from typing import Any

FAMILY_TABLE: tuple[dict[str, Any], ...] = (
'''


def table_source(rows: Sequence[FamilyRow]) -> str:
    """The module, written as ``ruff format`` leaves it (each entry exploded by its trailing comma)."""
    entries = []
    for row in rows:
        fields = {
            "name": row.name,
            "display_name": row.display_name,
            "summary": row.summary,
            "block_length": row.block_length,
            "steps_per_block": row.steps_per_block,
            "kind": row.kind,
            "tiny_preset": row.tiny_preset,
            "expert_parallel": row.expert_parallel,
            "model_types": list(row.model_types),
            "default_context": row.default_context,
        }
        lines = "".join(f"        {json.dumps(key)}: {_python(value)},\n" for key, value in fields.items())
        lines += f'        "request_settings": {settings_source(row.request_settings)},\n'
        entries.append(f"    {{\n{lines}    }},\n")
    return TABLE_HEAD + "".join(entries) + ")\n"


def settings_source(settings: Sequence[dict[str, Any]]) -> str:
    """A family's request settings as a tuple of dicts, one key a line (as ruff format leaves them)."""
    if not settings:
        return "()"
    items = []
    for item in settings:
        lines = "".join(
            f"                {json.dumps(key)}: {_python(value)},\n" for key, value in item.items()
        )
        items.append(f"            {{\n{lines}            }},\n")
    return "(\n" + "".join(items) + "        )"


def _python(value: object) -> str:
    """A value as Python source (JSON's spelling is Python's but for null, true and false)."""
    return repr(value) if value is None or isinstance(value, bool) else json.dumps(value)


# the CRD


def yaml_scalar(text: str) -> str:
    """``text`` as a YAML value: plain where it reads back the same, double-quoted otherwise."""
    return text if yaml.safe_load(f"k: {text}") == {"k": text} else json.dumps(text)


def family_description(rows: Sequence[FamilyRow]) -> str:
    parts = "; ".join(f"{row.name} for {row.summary}" for row in rows)
    return yaml_scalar(f"The checkpoint's architecture ({parts}).")


DEFAULTS_LIST = re.compile(r"default \d+(?:, [a-z0-9_]+ \d+(?: \([^)]*\))?)*")
DEFAULT_NOTE = re.compile(r", ([a-z0-9_]+) \d+( \([^)]*\))?")


def described_defaults(old: str, rows: Sequence[FamilyRow], column: str) -> str:
    """``old`` with its "default 32, diffusion_gemma 256 (note)" list rewritten; a family's note stays."""
    found = DEFAULTS_LIST.search(old)
    if found is None:
        raise GenerationError(f"no 'default N, family N' list in the description {old!r}")
    notes = {match[1]: match[2] or "" for match in DEFAULT_NOTE.finditer(found[0])}
    default = getattr(rows[0], column)
    listed = [f"default {default}"] + [
        f"{row.name} {getattr(row, column)}{notes.get(row.name, '')}"
        for row in rows
        if getattr(row, column) != default
    ]
    return old[: found.start()] + ", ".join(listed) + old[found.end() :]


def field_lines(text: str, field: str, replacements: dict[str, Callable[[str], str]]) -> str:
    """``text`` with the one-line ``key: value`` children of the one ``field:`` key rewritten."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if re.fullmatch(rf"\s*{field}:\s*", line)]
    if len(starts) != 1:
        raise GenerationError(f"expected one '{field}:' key, found {len(starts)}")
    indent = len(lines[starts[0]]) - len(lines[starts[0]].lstrip())
    todo = dict(replacements)
    for i in range(starts[0] + 1, len(lines)):
        child = re.fullmatch(r"( *)([A-Za-z]+): (.*?)(\n?)", lines[i])
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= indent:
            break
        if child and child[2] in todo and len(child[1]) == indent + 2:
            lines[i] = f"{child[1]}{child[2]}: {todo.pop(child[2])(child[3])}{child[4]}"
    if todo:
        raise GenerationError(f"'{field}:' has no one-line {', '.join(todo)}")
    return "".join(lines)


def cel_default(rows: Sequence[FamilyRow], column: str) -> str:
    """The CEL expression for a family's default: the families that differ, then the default family's."""
    default = getattr(rows[0], column)
    arms = [
        f"self.model.family == '{row.name}' ? {getattr(row, column)} : "
        for row in rows
        if getattr(row, column) != default
    ]
    return "".join(arms) + str(default)


def cel_chains(text: str, field: str, chain: str) -> str:
    """Every ``has(self.decoding.F) ? self.decoding.F : <chain>`` in the CEL rules, with ``chain``."""
    pattern = re.compile(
        rf"(has\(self\.decoding\.{field}\) \? self\.decoding\.{field} : )"
        r"(?:self\.model\.family == '[a-z0-9_]+' \? \d+ : )*\d+"
    )
    written, count = pattern.subn(lambda found: found[1] + chain, text)
    if not count:
        raise GenerationError(f"no CEL rule defaults decoding.{field} per family")
    return written


EXPERT_RULE = re.compile(
    r"(- rule: \"self\.parallelism\.expert == 1 \|\| self\.model\.family in )\[[^\]]*\](\"\n\s*message: "
    r"parallelism\.expert above 1 needs a mixture-of-experts family \()[^)]*(\))"
)


def expert_rule(text: str, rows: Sequence[FamilyRow]) -> str:
    """The CEL rule that admits parallelism.expert above 1 for the families with experts only."""
    names = [row.name for row in rows if row.expert_parallel]
    listed = ", ".join(f"'{name}'" for name in names)
    written, count = EXPERT_RULE.subn(lambda m: f"{m[1]}[{listed}]{m[2]}{', '.join(names)}{m[3]}", text)
    if count != 1:
        raise GenerationError(f"expected one CEL rule on parallelism.expert's families, found {count}")
    return written


def crd_text(text: str, rows: Sequence[FamilyRow]) -> str:
    names = ", ".join(row.name for row in rows)
    text = field_lines(
        text,
        "family",
        {
            "enum": lambda _: f"[{names}]",
            "default": lambda _: rows[0].name,
            "description": lambda _: family_description(rows),
        },
    )
    for field, column in (("blockLength", "block_length"), ("stepsPerBlock", "steps_per_block")):
        text = field_lines(
            text, field, {"description": lambda old, c=column: described_defaults(old, rows, c)}
        )
        text = cel_chains(text, field, cel_default(rows, column))
    return expert_rule(text, rows)


# the chart


def values_text(text: str, rows: Sequence[FamilyRow]) -> str:
    names = ", ".join(row.name for row in rows)
    written, count = re.subn(r"(?m)^supportedFamilies: \[.*\]$", f"supportedFamilies: [{names}]", text)
    if count != 1:
        raise GenerationError(f"expected one 'supportedFamilies: [...]' line, found {count}")
    return written


def values_schema_text(text: str, rows: Sequence[FamilyRow]) -> str:
    schema = json.loads(text)
    names = [row.name for row in rows]
    try:
        schema["properties"]["supportedFamilies"]["items"]["enum"] = names
        schema["properties"]["example"]["properties"]["family"]["enum"] = names
    except KeyError as missing:
        raise GenerationError(f"no {missing} where the family enums belong") from None
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


# the documents and the package summary

# how README's Models table describes each cache kind: (attention, cache)
KIND_WORDS = {
    "bidirectional": ("bidirectional", "Fast-dLLM dual cache, refreshed at each block"),
    "block_causal": ("causal across blocks", "exact: a block's keys and values kept once committed"),
    "canvas": (
        "causal encoder, bidirectional canvas",
        "exact: the context's keys and values kept across canvases",
    ),
}
MODELS_HEADER = "| family | checkpoints | attention | cache | CPU-sized random model |"
DISPLAY_LIST = re.compile(r"(diffusion LLMs \()([^)]*)(\))", re.IGNORECASE)
FAMILY_FLAG_LIST = re.compile(
    r"(`--family NAME` \()`[a-z0-9_]+`(?:(?:, | or )`[a-z0-9_]+`)*(, on the same commands\))"
)


def _once(pattern: re.Pattern, replacement: Callable[[re.Match], str], text: str, what: str) -> str:
    written, count = pattern.subn(replacement, text, count=2)
    if count != 1:
        raise GenerationError(f"expected one {what}, found {count}")
    return written


def _display_names(rows: Sequence[FamilyRow]) -> str:
    return ", ".join(row.display_name for row in rows)


def models_table(rows: Sequence[FamilyRow]) -> str:
    """README's Models table: a row per family."""
    lines = [MODELS_HEADER, "|---|---|---|---|---|"]
    for row in rows:
        attention, cache = KIND_WORDS[row.kind]
        lines.append(
            f"| `{row.name}` | {row.checkpoints} | {attention} | {cache} | `random:{row.tiny_preset}` |"
        )
    return "\n".join(lines) + "\n"


def readme_text(text: str, rows: Sequence[FamilyRow]) -> str:
    """The families named in the paragraph under the title, and the Models table (header to blank line)."""
    parts = text.split("\n\n", 2)  # the title, the paragraph under it, the rest
    if len(parts) < 3:
        raise GenerationError("no paragraph under the title")
    parts[1] = _once(
        DISPLAY_LIST,
        lambda found: found[1] + _display_names(rows) + found[3],
        parts[1],
        "'Diffusion LLMs (...)'",
    )
    table = re.compile(rf"^{re.escape(MODELS_HEADER)}\n(?:\|.*\n)+", re.MULTILINE)
    return _once(table, lambda _: models_table(rows), "\n\n".join(parts), "Models table")


def pyproject_text(text: str, rows: Sequence[FamilyRow]) -> str:
    summary = re.compile(r'^(description = ".*?)(diffusion LLMs \()([^)]*)(\).*")$', re.MULTILINE)
    return _once(
        summary,
        lambda found: found[1] + found[2] + _display_names(rows) + found[4],
        text,
        "description naming the families",
    )


def models_doc_text(text: str, rows: Sequence[FamilyRow]) -> str:
    names = [f"`{row.name}`" for row in rows]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return _once(
        FAMILY_FLAG_LIST, lambda found: found[1] + listed + found[2], text, "'`--family NAME` (...)' list"
    )


# the files


def generated(root: Path, rows: Sequence[FamilyRow]) -> dict[str, str]:
    """Each file's path under ``root`` -> what it should hold."""
    check_rows(rows)
    written = {TABLE: table_source(rows)}
    for path in CRDS:
        written[path] = _rendered(root, path, crd_text, rows)
    written[VALUES] = _rendered(root, VALUES, values_text, rows)
    written[VALUES_SCHEMA] = _rendered(root, VALUES_SCHEMA, values_schema_text, rows)
    written[README] = _rendered(root, README, readme_text, rows)
    written[PYPROJECT] = _rendered(root, PYPROJECT, pyproject_text, rows)
    written[MODELS_DOC] = _rendered(root, MODELS_DOC, models_doc_text, rows)
    return written


def _rendered(
    root: Path, path: str, render: Callable[[str, Sequence[FamilyRow]], str], rows: Sequence[FamilyRow]
) -> str:
    try:
        return render((root / path).read_text(), rows)
    except GenerationError as error:
        raise GenerationError(f"{path}: {error}") from None


def stale_files(root: Path, written: dict[str, str]) -> list[str]:
    def current(path: Path) -> str | None:
        return path.read_text() if path.exists() else None

    return [path for path, text in written.items() if current(root / path) != text]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Write the CRD's, the Helm chart's, dllm_contracts', README's, the package summary's "
        "and docs/models.md's lists of model families from the engine's family registry "
        "(engine_pod/families/registry.py).",
        epilog=f"Files: {', '.join(FILES)}.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming each file that differs from what the registry gives",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the directory holding those files (default: this repository)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None, rows: Sequence[FamilyRow] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        written = generated(args.root, registry_rows() if rows is None else rows)
    except (GenerationError, OSError, ValueError) as error:
        log.error("error: %s", error)
        return 2
    stale = stale_files(args.root, written)
    if args.check:
        for path in stale:
            log.error("%s differs from the family registry: run scripts/generate_family_tables.py", path)
        return 1 if stale else 0
    for path in stale:
        (args.root / path).write_text(written[path])
        log.info("wrote %s", path)
    if not stale:
        log.info("every family list is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
