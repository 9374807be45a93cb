"""Reading config.json the way a published configuration class does: an absent field takes the class's
default, and a field the engine implements for one value only is refused by name for any other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine_pod.models.config import ModelConfigError


def reader_with_defaults(raw: dict[str, Any], defaults: dict[str, Any]) -> Callable[[str], Any]:
    """``get(key)``: config.json's value, or the reference class's default when the field is absent."""

    def get(key: str) -> Any:
        return raw[key] if key in raw else defaults[key]

    return get


def check_fixed(who: str, get, defaults: dict[str, Any], fixed: tuple[str, ...]) -> None:
    """Refuse, by name, a field in ``fixed`` whose value is not the default (the one implemented)."""
    for key in fixed:
        if get(key) != defaults[key]:
            raise ModelConfigError(
                f"{who} config field {key}={get(key)!r} is not supported (expected {defaults[key]!r})"
            )


def needed(get, key: str, why: str) -> int:
    """A field that has no default but that ``why`` needs."""
    value = get(key)
    if value is None:
        raise ModelConfigError(f"config.json has no {key}, which {why} need")
    return int(value)
