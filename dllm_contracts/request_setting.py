"""How a per-request setting is declared: its type, default, range and meaning, written once (no torch).

A setting is a field of a frozen dataclass declared with ``setting(...)``: the fields of ``RequestParams``
(dllm_contracts/request_params.py) and those a model family adds (the class its ``ModelFamily`` names as
``request_params``). Its range is written there and nowhere else: the dataclass checks every value it is
built with (``check_settings``), the gateway's request schema takes each field's bounds from the
declaration (``Setting.field_bounds``), and the family table (dllm_contracts/family_table.py) carries a
family's declarations to the gateway as rows (``Setting.to_row``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SETTING = "setting"  # the metadata key of a declared field
KINDS: dict[str, type] = {"int": int, "float": float}


class SettingError(ValueError):
    """A setting's value out of its range (or of the wrong type): names the setting (``param``) and says
    what is wrong in one line; ``code`` is the API error code a gateway answers it with."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


@dataclass(frozen=True)
class Setting:
    """One per-request setting: what a request may set, and to what."""

    name: str
    kind: type  # int or float (a float takes an int too; neither takes a bool, a float takes no inf or NaN)
    default: Any  # what a request that leaves it unset gets (None: the service decides)
    description: str
    low: float | None = None  # the lowest value (None: no lower bound)
    high: float | None = None  # the highest value (None: no upper bound)
    low_open: bool = False  # ``low`` itself is out of range
    high_open: bool = False  # ``high`` itself is out of range
    above: str | None = None  # another setting of the same class whose value this one must exceed
    # the service's decoding setting this one may not exceed (its name, as the gateway's settings and the
    # engine's decoding config call it: "steps_per_block"); None: none
    ceiling: str | None = None
    # a dLLM setting the OpenAI API does not define: the gateway's body takes it by its name, as an extra
    # body field (a family's settings always are); False: an OpenAI field, which the gateway maps itself
    extra_body: bool = False

    def check(self, value: Any) -> None:
        """SettingError naming the setting unless ``value`` is of its kind and in its range (None passes
        where the default is None)."""
        if value is None and self.default is None:
            return
        kind = type(value)
        if (kind is self.kind or (kind is int and self.kind is float)) and self.in_range(value):
            return
        self._refuse(value)

    def _refuse(self, value: Any) -> None:
        number = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, number):
            noun = "an integer" if self.kind is int else "a number"
            raise SettingError(self.name, f"{self.name} must be {noun}, got {value!r}", "invalid_type")
        raise SettingError(self.name, f"{self.name} must be {self.range_text()}, got {value}")

    def in_range(self, value: float) -> bool:
        """Within the bounds, and finite (NaN and inf are in no range)."""
        above_low = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below_high = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above_low and below_high and -math.inf < value < math.inf

    def range_text(self) -> str:
        """ "in [0, 2]", "in (0, 1]", ">= 1", ...: the range as a message says it."""
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return f"{'<' if self.high_open else '<='} {high}" if self.high is not None else "a finite number"

    def field_bounds(self) -> dict[str, Any]:
        """The range as pydantic's ``Field`` takes it (ge/gt, le/lt; a float field refuses inf and NaN)."""
        bounds: dict[str, Any] = {} if self.kind is int else {"allow_inf_nan": False}
        if self.low is not None:
            bounds["gt" if self.low_open else "ge"] = self.low
        if self.high is not None:
            bounds["lt" if self.high_open else "le"] = self.high
        return bounds

    def to_row(self) -> dict[str, Any]:
        """The declaration as plain data (the family table's rows): the fields that differ from their
        defaults, the kind by its name."""
        row = {
            item.name: getattr(self, item.name)
            for item in dataclasses.fields(self)
            if item.default is dataclasses.MISSING or getattr(self, item.name) != item.default
        }
        return row | {"kind": self.kind.__name__}

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Setting:
        return cls(**{**row, "kind": KINDS[row["kind"]]})


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting(default: Any, description: str, **bounds: Any) -> Any:
    """A dataclass field declaring a setting: its default, what it means and its range (``Setting``'s
    low, high, low_open, high_open, above, ceiling, extra_body); its name and kind are the field's."""
    return dataclasses.field(default=default, metadata={SETTING: {"description": description, **bounds}})


@functools.cache
def settings_of(cls: type) -> dict[str, Setting]:
    """The settings a dataclass declares, by name, in field order."""
    hints = typing.get_type_hints(cls)
    declared = {}
    for item in dataclasses.fields(cls):
        if SETTING in item.metadata:
            kind = _kind(hints[item.name], f"{cls.__name__}.{item.name}")
            declared[item.name] = Setting(item.name, kind, item.default, **item.metadata[SETTING])
    return declared


def _kind(hint: Any, where: str) -> type:
    """int or float, from a field's type (``int``, ``float | None``)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    kinds = [option for option in options if option in (int, float)]
    if len(kinds) != 1:
        raise TypeError(f"{where}: a setting is an int or a float (or None), not {hint}")
    return kinds[0]


def check_settings(instance: Any) -> None:
    """Every declared setting of a dataclass instance in its range, and above the one it must exceed."""
    declared, related = _checks(type(instance))
    for name, item in declared:
        item.check(getattr(instance, name))
    if related:
        check_relations({name: getattr(instance, name) for name in related}, settings_of(type(instance)))


@functools.cache
def _checks(cls: type) -> tuple[tuple[tuple[str, Setting], ...], tuple[str, ...]]:
    """A class's settings, and the names in its relations (each that must exceed another, and that one)."""
    declared = settings_of(cls)
    related = {name for name, item in declared.items() if item.above} | {
        item.above for item in declared.values() if item.above
    }
    return tuple(declared.items()), tuple(name for name in declared if name in related)


def check_relations(values: Mapping[str, Any], declared: Mapping[str, Setting]) -> None:
    """Each setting that must exceed another does, where both have a value."""
    for name, value in values.items():
        other = declared[name].above
        if other is None or value is None or values.get(other) is None:
            continue
        if not value > values[other]:
            raise SettingError(name, f"{name} {value} must be above {other} {values[other]}")


def check_ceilings(
    values: Mapping[str, Any], declared: Mapping[str, Setting], limit: Callable[[str, str], Any]
) -> None:
    """Each setting with a ceiling at most the service's limit, ``limit(setting's name, ceiling's name)``."""
    for name, value in values.items():
        ceiling = declared[name].ceiling
        if ceiling is None or value is None:
            continue
        most = limit(name, ceiling)
        if value > most:
            words = ceiling.replace("_", " ")
            raise SettingError(
                name, f"{name} {value} is above this service's {most} {words}", "integer_above_max_value"
            )


class DeclaredSettings:
    """A frozen dataclass of declared settings, checked when it is built (a base for ``RequestParams``
    and a family's own settings)."""

    def __post_init__(self) -> None:
        check_settings(self)
