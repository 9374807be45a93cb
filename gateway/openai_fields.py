"""Fields OpenAI defines that this server does not implement, and what makes each harmless.

A request may carry such a field only with a value that does nothing by OpenAI's own definition
(``tools: []``, ``response_format: {"type": "text"}``, ``presence_penalty: 0``, ...); any other value is
a 400 naming the field (code ``unsupported_parameter``), never silently ignored. Fields OpenAI does not
define at all are refused too (``unknown_parameter``) unless the service is set to ignore them.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticCustomError


def _empty(value: Any) -> bool:
    return value in ([], {}, "")


def _none_choice(value: Any) -> bool:
    return value == "none"


def _zero(value: Any) -> bool:
    return value == 0


def _always(_: Any) -> bool:
    return True


# field -> whether a value does nothing (None, "absent", always does nothing)
HARMLESS: dict[str, Callable[[Any], bool]] = {
    "functions": _empty,  # the deprecated form of tools
    "function_call": _none_choice,
    "logit_bias": _empty,
    "presence_penalty": _zero,
    "frequency_penalty": _zero,
    "modalities": lambda value: value == ["text"],
    "audio": lambda _: False,
    "prediction": lambda _: False,
    "reasoning_effort": lambda _: False,
    "verbosity": lambda _: False,
    "web_search_options": lambda _: False,
    "store": lambda value: value is False,  # stored completions are not kept here
    "service_tier": lambda value: value in ("auto", "default"),
    "metadata": _always,  # tags for stored completions (not kept): describes, changes nothing
    "prompt_cache_key": _always,  # a caching hint
    "safety_identifier": _always,  # an abuse-monitoring id
    "best_of": lambda value: value == 1,
    "suffix": _empty,
    "refusal": lambda _: False,  # on a message
}
CHAT_ONLY = (
    "functions",
    "function_call",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "store",
    "service_tier",
    "metadata",
    "prompt_cache_key",
    "safety_identifier",
)
COMPLETIONS_ONLY = ("best_of", "suffix")
BOTH = ("logit_bias", "presence_penalty", "frequency_penalty")


def refuse_unless_harmless(value: Any, field: str) -> Any:
    """``value`` when it does nothing; otherwise the 400 that names ``field``."""
    if value is not None and not HARMLESS[field](value):
        raise PydanticCustomError(
            "unsupported_parameter",
            "not supported by this server (text generation only); leave the field out",
        )
    return value


def unknown_fields(model: BaseModel, path: str = "") -> list[str]:
    """Every field of ``model`` and the models inside it that its class does not define (dotted names,
    list items as ``[i]``), in the order they were sent. Only fields whose type can hold a model are
    walked (a prompt's thousand token ids are not)."""
    found = [f"{path}.{name}" if path else name for name in (model.model_extra or {})]
    for name in _model_holding_fields(type(model)):
        value = getattr(model, name)
        if isinstance(value, BaseModel) or (
            isinstance(value, list) and value and isinstance(value[0], BaseModel)
        ):
            found += _inside(value, f"{path}.{name}" if path else name)
    return found


@functools.cache
def _model_holding_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``cls`` whose declared type has a model in it, in declaration order."""
    return tuple(name for name, field in cls.model_fields.items() if _holds_model(field.annotation))


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(argument) for argument in typing.get_args(annotation))


def _inside(value: Any, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        return unknown_fields(value, path)
    return [name for i, item in enumerate(value) for name in _inside(item, f"{path}[{i}]")]
