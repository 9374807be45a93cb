"""Each per-request setting's range is written in one place, its declaration: a ``setting`` field of
``RequestParams`` or of a family's ``request_params`` class, or an API field's ``Setting`` in
dllm_contracts/request_params.py. A scan of the product code finds every other place that would define
one: a pydantic ``Field`` for the setting with literal bounds, or a comparison of the setting with a number
that refuses a value (in an ``if`` that raises, or a ``(condition, message)`` check). The gateway's schema
takes each field's bounds from the declaration."""

from __future__ import annotations

import ast
import dataclasses
from collections import defaultdict
from pathlib import Path

import pytest

from dllm_contracts.queue.messages import QueuedRequest
from dllm_contracts.request_params import (
    CHOICES,
    COMPLETION_ALTERNATIVES,
    FAMILY_SETTINGS,
    REQUEST_SETTINGS,
    STOPS,
    RequestParams,
)
from engine_pod.scheduler.cycle_row import CycleRow
from engine_pod.scheduler.request import Request
from gateway.schemas import ChatCompletionRequest, CompletionRequest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("dllm_contracts", "gateway", "engine_pod", "operator/dllm_operator", "scripts")
GENERATED = {"dllm_contracts/family_table.py"}  # written from the declarations (its --check test)
# API fields that are a setting under another name
ALIASES = {"max_completion_tokens": "max_tokens", "top_logprobs": "logprobs"}
SETTINGS = {*REQUEST_SETTINGS, *FAMILY_SETTINGS, CHOICES.name, STOPS.name}
BOUNDS = {"ge", "gt", "le", "lt", "max_length", "min_length"}
# refusals that are no setting's range, each with why
NOT_RANGES = {
    ("gateway/batch_ingest.py", "n"): "a batch line takes one choice (the batch API's rule)",
    ("engine_pod/cli/eval.py", "n"): "dllm eval's --n: how many problems (no request's)",
}


def _setting_of(node: ast.AST) -> str | None:
    """The setting a name or an attribute names (``temperature``, ``body.top_p``, ``self.threshold``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    name = ALIASES.get(name, name)
    return name if name in SETTINGS else None


def _number(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    return isinstance(node, ast.BinOp) and _number(node.left) and _number(node.right)


def _compared(test: ast.AST) -> set[str]:
    """Settings compared with a number anywhere in ``test``."""
    found = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = {_setting_of(operand) for operand in operands} - {None}
            if names and any(_number(operand) for operand in operands):
                found |= names
    return found


def _call_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)


def range_definitions(source: str) -> list[tuple[str, int, str]]:
    """(setting, line, what) for every place in ``source`` that defines a setting's range."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = ALIASES.get(node.target.id, node.target.id)
            kind = _call_name(node.value)
            literal = any(k.arg in BOUNDS and _number(k.value) for k in getattr(node.value, "keywords", ()))
            if name in SETTINGS and (kind == "setting" or (kind == "Field" and literal)):
                found.append((name, node.lineno, f"{kind}(...)"))
        elif _call_name(node) == "Setting" and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.args[0].value, node.lineno, "Setting(...)"))
        elif isinstance(node, ast.If) and any(isinstance(n, ast.Raise) for n in ast.walk(node)):
            found += [(name, node.lineno, "a refusing if") for name in _compared(node.test)]
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and _is_message(node.elts[1]):
            found += [(name, node.lineno, "a (check, message)") for name in _compared(node.elts[0])]
    return found


def _is_message(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def product_definitions() -> dict[str, list[str]]:
    """Setting -> the places that define its range, over the product code."""
    places = defaultdict(list)
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative in GENERATED:
                continue
            for name, line, what in range_definitions(path.read_text()):
                if (relative, name) not in NOT_RANGES:
                    places[name].append(f"{relative}:{line} ({what})")
    return places


def test_each_setting_has_its_range_in_one_place():
    places = product_definitions()
    assert set(places) == SETTINGS, sorted(SETTINGS ^ set(places))
    doubled = {name: found for name, found in places.items() if len(found) != 1}
    assert not doubled, doubled


def test_the_scan_finds_a_range_written_again():
    """What a second definition would look like is found (so the test above can fail)."""
    source = """
class Body(BaseModel):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, description="not a range")
    max_completion_tokens: int | None = Field(None, ge=1)

@dataclass
class Sampling:
    seed: int = setting(0, "a seed", low=0)

    def __post_init__(self):
        checks = [(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")]
        if not 0 <= body.threshold <= 1:
            raise ValueError("threshold")
        if self.top_k > 0:  # a use, not a refusal
            keep = 1
        if family.t_max < 2**40:
            raise SettingError("t_max", "too high")
"""
    found = {(name, what) for name, _, what in range_definitions(source)}
    assert found == {
        ("temperature", "Field(...)"),
        ("max_tokens", "Field(...)"),
        ("seed", "setting(...)"),
        ("top_p", "a (check, message)"),
        ("threshold", "a refusing if"),
        ("t_max", "a refusing if"),
    }


SCHEMA_BOUNDS = {"minimum": "ge", "exclusiveMinimum": "gt", "maximum": "le", "exclusiveMaximum": "lt"}


def schema_bounds(schema: dict) -> dict:
    """A field's bounds in its JSON schema (an optional field's in its non-null branch), as Field's."""
    branches = schema.get("anyOf", [schema])
    return {
        SCHEMA_BOUNDS[key]: value
        for branch in branches
        for key, value in branch.items()
        if key in SCHEMA_BOUNDS
    }


@pytest.mark.parametrize("body", [CompletionRequest, ChatCompletionRequest])
def test_the_gateway_takes_each_fields_bounds_from_its_declaration(body):
    """Every body field for a setting has the declaration's bounds in the API's schema, the completions
    API's logprobs but its upper one (fewer alternatives, as OpenAI's)."""
    declared = {**REQUEST_SETTINGS, **FAMILY_SETTINGS, "n": CHOICES}
    checked = set()
    for field_name, schema in body.model_json_schema()["properties"].items():
        name = ALIASES.get(field_name, field_name)
        if name not in declared or (field_name == "logprobs" and body is ChatCompletionRequest):
            continue  # the chat API's logprobs is a flag (its alternatives: top_logprobs)
        expected = {
            key: value
            for key, value in declared[name].field_bounds().items()
            if key in SCHEMA_BOUNDS.values()
        }
        if body is CompletionRequest and field_name == "logprobs":
            expected["le"] = COMPLETION_ALTERNATIVES
        assert schema_bounds(schema) == expected, field_name
        checked.add(name)
    assert checked == set(declared)


# what carries a request's settings from the queue to the runner: each holds them in one RequestParams
CARRIERS = (QueuedRequest, Request, CycleRow)
CONTRACT_FIELDS = {item.name for item in dataclasses.fields(RequestParams)}  # the grammar among them


@pytest.mark.parametrize("carrier", CARRIERS, ids=lambda carrier: carrier.__name__)
def test_no_carrier_declares_a_setting_again(carrier):
    """The queue's payload, the scheduler's request and a cycle's row hold the settings as one
    ``RequestParams`` (``params``), none of them a field of its own (the grammar neither)."""
    fields = {item.name for item in dataclasses.fields(carrier)}
    assert "params" in fields
    assert not fields & CONTRACT_FIELDS, sorted(fields & CONTRACT_FIELDS)


def rows_from_requests(source: str) -> list[int]:
    """The lines of ``source`` that build a ``CycleRow`` with a request's settings (a ``params`` keyword)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if _call_name(node) == "CycleRow" and any(k.arg == "params" for k in node.keywords)
    ]


def test_a_request_becomes_a_row_in_one_place():
    """Every scheduler builds its rows with ``Scheduler.row_of``: the request-to-row copy is written once."""
    found = {
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for path in sorted((ROOT / "engine_pod/scheduler").rglob("*.py"))
        for line in rows_from_requests(path.read_text())
    }
    assert len(found) == 1 and next(iter(found)).startswith("engine_pod/scheduler/base.py:"), found


def test_the_row_scan_finds_a_second_copy():
    source = """
def _row(self, request):
    return CycleRow(request.prompt_ids, owner=request.request_id, params=request.params)

def row_of(self, request):
    return CycleRow(prefix, params=request.params)
"""
    assert rows_from_requests(source) == [3, 6]


# where nothing names a setting a family adds (the family declares it, its kind's stepper and sampler use it)
FAMILY_BLIND = (
    "gateway",
    "engine_pod/worker",
    "engine_pod/scheduler",
    "engine_pod/runner",
    "engine_pod/bench",
)


def family_setting_names(source: str) -> list[tuple[str, int]]:
    """(setting, line) for each name, attribute, keyword or string in ``source`` that is a family's
    setting (``FAMILY_SETTINGS``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        word = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else node.arg
            if isinstance(node, ast.keyword)
            else node.value
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else None
        )
        if word in FAMILY_SETTINGS:
            found.append((word, getattr(node, "lineno", 0)))
    return found


def test_no_family_setting_is_named_outside_its_family_and_kind():
    assert FAMILY_SETTINGS  # DiffusionGemma declares some: the scan has names to look for
    named = [
        f"{path.relative_to(ROOT).as_posix()}:{line} {word}"
        for folder in FAMILY_BLIND
        for path in sorted((ROOT / folder).rglob("*.py"))
        for word, line in family_setting_names(path.read_text())
    ]
    assert not named, named


def test_the_family_setting_scan_finds_one_named():
    source = 'steps = min(row.params.family.get("max_denoising_steps", 48), cap)\nt_max = 0.8\n'
    assert sorted(family_setting_names(source)) == [("max_denoising_steps", 1), ("t_max", 2)]
