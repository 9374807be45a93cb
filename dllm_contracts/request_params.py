"""One request's settings from the API to the sampler: one typed definition, with ranges and defaults (no
torch).

``RequestParams`` is built once, by the gateway from a request's body (or by ``dllm generate`` from its
flags), and queued as it is; the worker, the scheduler's request and each cycle's row carry it, and the
runner reads it (vLLM's ``SamplingParams``, nano-vllm's ``Sequence``). Every field is declared with its
range (dllm_contracts/request_setting.py); the gateway's schema takes its bounds from here, and building
one checks them. What a model family adds (DiffusionGemma's sampler) is declared by the family, in the
class its ``ModelFamily.request_params`` names (a ``FamilyParams``), carried to the gateway by the family
table, and travels here in ``family``, by name: nothing between the gateway and the family's own code
names it. A new setting is one field where it is declared and the code that uses it.

A few settings never reach the engine: the API's own fields, declared here too (``CHOICES``, ``STOPS``;
the completions API allows fewer alternatives than the chat API: ``COMPLETION_ALTERNATIVES``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dllm_contracts.family_table import FAMILY_TABLE
from dllm_contracts.request_setting import (
    DeclaredSettings,
    Setting,
    SettingError,
    check_ceilings,
    check_relations,
    setting,
    settings_of,
)
from dllm_contracts.structured_output import ResponseGrammar

MAX_SEED = 2**63  # seeds are int64 (a torch.Generator's seed, the sampler's keys)


@dataclass(frozen=True)
class RequestParams(DeclaredSettings):
    """How one request is generated. Noise depends only on ``seed`` and where a token is drawn, never on
    the batch: a seeded request's output is the same alone or in any batch."""

    max_tokens: int | None = setting(
        None, "tokens to generate at most (None: no limit but the blocks)", low=1
    )
    temperature: float = setting(0.0, "0: greedy decoding (the argmax), the default", low=0.0, high=2.0)
    top_p: float = setting(
        1.0,
        "nucleus sampling: the likeliest tokens whose probability reaches top_p",
        low=0.0,
        low_open=True,
        high=1.0,
    )
    top_k: int = setting(0, "sample among the k likeliest tokens (0: all)", low=0)
    seed: int = setting(
        0,
        "the same seed reproduces a sampled output (and noise a model starts from)",
        low=0,
        high=MAX_SEED,
        high_open=True,
    )
    threshold: float | None = setting(
        None,
        "confidence threshold for this request (None: the service's)",
        low=0.0,
        low_open=True,
        high=1.0,
        extra_body=True,
    )
    logprobs: int | None = setting(
        None, "each token's log probability and this many alternatives (None: none)", low=0, high=20
    )
    # the settings of the served model's family this request sets, by name (FAMILY_SETTINGS'; the family's
    # ``request_params`` class declares them); unset ones: the service's
    family: dict[str, int | float] = dataclasses.field(default_factory=dict, hash=False)
    grammar: ResponseGrammar | None = None  # the grammar its answer keeps to (structured outputs); None: free

    def __post_init__(self) -> None:
        super().__post_init__()
        check_family(self.family)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_wire(self) -> dict[str, Any]:
        """The fields that differ from their defaults (the queue's payload: a greedy request's is empty),
        the grammar in its wire form."""
        wire = {name: value for name, value in vars(self).items() if value != DEFAULTS[name]}
        return wire | ({"grammar": self.grammar.to_wire()} if self.grammar is not None else {})

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RequestParams:
        """From ``to_wire``'s dict; SettingError naming a field this version does not know, or a value
        out of range."""
        unknown = sorted(set(data) - set(DEFAULTS))
        if unknown:
            raise SettingError(unknown[0], f"unknown request settings: {', '.join(unknown)}")
        if data.get("grammar") is None:
            return cls(**data)
        try:
            grammar = ResponseGrammar.from_wire(data["grammar"])
        except (KeyError, TypeError, ValueError) as error:
            raise SettingError("grammar", f"invalid response grammar: {error}") from None
        return cls(**{**data, "grammar": grammar})


REQUEST_SETTINGS: dict[str, Setting] = settings_of(RequestParams)  # every request's, by name
# those the API's body takes by name (dLLM settings OpenAI does not define): no gateway code names them
EXTRA_BODY_SETTINGS = {name: item for name, item in REQUEST_SETTINGS.items() if item.extra_body}
DEFAULTS: dict[str, Any] = {name: item.default for name, item in REQUEST_SETTINGS.items()}
DEFAULTS |= {"family": {}, "grammar": None}

# the API's fields that never reach the engine: their ranges, declared as the settings' are
CHOICES = Setting("n", int, 1, "choices per prompt, each drawn with its own seed", low=1, high=16)
STOPS = Setting("stop", int, 0, "strings that end the text (how many)", low=0, high=4)  # as OpenAI
COMPLETION_ALTERNATIVES = 5  # the completions API's logprobs at most (OpenAI's); the chat API's: logprobs'


class FamilyParams(DeclaredSettings):
    """Base of a family's own per-request settings (a frozen dataclass of ``setting`` fields): an instance
    holds a service's values, which a request's ``family`` settings replace."""

    @classmethod
    def for_service(cls, generation: Mapping[str, Any], steps_per_block: int) -> FamilyParams:
        """A service's values, from its checkpoint's generation config (``generation``, as read) and the
        engine's steps per block; here the declared defaults (a family whose values come from there
        overrides this)."""
        return cls()

    def for_request(self, given: Mapping[str, Any] | None) -> FamilyParams:
        """These settings (the service's) with those a request sets (``given``, by name). SettingError for
        a name this family does not declare, a value out of range, a relation broken once merged, or a
        value above the service's own where the setting has a ceiling (the service's value of a setting
        with a ceiling is that decoding setting's)."""
        if not given:
            return self
        declared = settings_of(type(self))
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise SettingError(unknown[0], f"unknown settings: {', '.join(unknown)}")
        merged = replace(self, **given)
        check_ceilings(given, declared, lambda name, _ceiling: getattr(self, name))
        return merged


def family_settings_error(given: Mapping[str, Any], service: FamilyParams | None, family: str) -> str | None:
    """Why a request's family settings (``given``) cannot run on a service of ``family`` (its display
    name) whose values are ``service`` (None: the family declares none); None: they can."""
    if not given:
        return None
    declared = {} if service is None else settings_of(type(service))
    foreign = sorted(set(given) - set(declared))
    if foreign:
        what = "a setting" if len(foreign) == 1 else "settings"
        return (
            f"{', '.join(foreign)}: not {what} of {family}; leave {'it' if len(foreign) == 1 else 'them'} out"
        )
    try:
        service.for_request(given)
    except SettingError as error:
        return f"invalid request settings: {error}"
    return None


def _family_settings() -> tuple[dict[str, Setting], dict[str, tuple[str, ...]]]:
    """Every setting some family declares (the family table's), by name, and the families (their display
    names) that declare each; a name two families declare differently, or one every request has, is
    refused."""
    union: dict[str, Setting] = {}
    owners: dict[str, tuple[str, ...]] = {}
    for row in FAMILY_TABLE:
        for declared in map(Setting.from_row, row.get("request_settings", ())):
            if union.setdefault(declared.name, declared) != declared:
                raise ValueError(f"two families declare the request setting {declared.name!r} differently")
            if declared.name in DEFAULTS:
                raise ValueError(f"family {row['name']}: {declared.name!r} is a setting of every request")
            owners[declared.name] = (*owners.get(declared.name, ()), row["display_name"])
    return union, owners


FAMILY_SETTINGS, FAMILY_SETTING_OWNERS = _family_settings()


def check_family(values: Mapping[str, Any]) -> None:
    """A request's family settings: each one some family declares, in its range, and above the one it must
    exceed where both are set (what a service's own values change is checked by ``for_request``)."""
    if not values:
        return
    declared = FAMILY_SETTINGS
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise SettingError(unknown[0], f"unknown request settings: {', '.join(unknown)}")
    for name, value in values.items():
        declared[name].check(value)
    check_relations(values, declared)


GREEDY = RequestParams()  # the settings of a request that sets none
