"""What each key may do: its tenant, its limits and its priority, from its line of the keys file.

A line of the keys file is a key (or several, separated by commas: each its own tenant with the line's
options), then optionally ``name=value`` options separated by spaces::

    sk-team-a rpm=60 tpm=100000 concurrency=8 batch_lines=50000 priority=high tenant=team-a
    sk-team-b
    sk-c,sk-d

A key without an option takes the default of the settings (``DLLM_LIMIT_*``, ``DLLM_DEFAULT_PRIORITY``);
0 means no limit. ``tenant=NAME`` names the key's tenant, so that a key rotated to a new one (same
``tenant``) keeps its files, batches and limits' counts; without it a key is its own tenant.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from gateway.settings import PRIORITIES, GatewaySettings, SettingsError

LIMIT_OPTIONS = {"rpm": "rpm", "tpm": "tpm", "concurrency": "concurrency", "batch_lines": "batch_lines"}
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Limits:
    rpm: int = 0  # requests per minute (0: none)
    tpm: int = 0  # tokens per minute: prompt and max_tokens of every choice (0: none)
    concurrency: int = 0  # requests in flight (0: none)
    batch_lines: int = 0  # lines of batches not yet ended (0: none)
    priority: str = "normal"  # high, normal or low: its requests' place in the queue's wait-based order

    @classmethod
    def defaults(cls, settings: GatewaySettings) -> Limits:
        return cls(
            settings.limit_rpm,
            settings.limit_tpm,
            settings.limit_concurrency,
            settings.limit_batch_lines,
            settings.default_priority,
        )

    @property
    def per_request(self) -> bool:
        """Whether admitting a request asks Redis anything (some limit on requests is set)."""
        return bool(self.rpm or self.tpm or self.concurrency)

    def head_start_ms(self, settings: GatewaySettings) -> int:
        return int(PRIORITIES[self.priority] * settings.priority_head_start_s * 1000)


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: its tenant and what that key may do."""

    tenant: str
    limits: Limits


def tenant_of_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def tenant_of_name(name: str) -> str:
    return hashlib.sha256(f"tenant:{name}".encode()).hexdigest()[:32]


def parse_line(line: str, number: int, defaults: Limits) -> dict[str, Caller]:
    """A keys file line's keys with their callers; errors name the line, never a key."""
    keys, *options = line.split()
    limits, tenant = defaults, None
    for option in options:
        name, sep, value = option.partition("=")
        where = f"line {number} of the API keys file"
        if not sep or not value:
            raise SettingsError(f"{where}: {option!r} is not NAME=VALUE")
        if name == "tenant":
            if not _TENANT_NAME.match(value):
                raise SettingsError(f"{where}: tenant {value!r} must be letters, digits, '.', '_', '-'")
            tenant = tenant_of_name(value)
        elif name == "priority":
            if value not in PRIORITIES:
                raise SettingsError(f"{where}: priority {value!r} must be one of {', '.join(PRIORITIES)}")
            limits = replace(limits, priority=value)
        elif name in LIMIT_OPTIONS:
            if not value.isdigit():
                raise SettingsError(f"{where}: {name}={value!r} must be a whole number (0: no limit)")
            limits = replace(limits, **{LIMIT_OPTIONS[name]: int(value)})
        else:
            known = ", ".join([*LIMIT_OPTIONS, "priority", "tenant"])
            raise SettingsError(f"{where}: unknown option {name!r} (known: {known})")
    return {key: Caller(tenant or tenant_of_key(key), limits) for key in keys.split(",") if key}


def parse_keys(text: str, defaults: Limits) -> dict[str, Caller]:
    """Every key of a keys file's ``text``: blank lines and lines starting with ``#`` are skipped."""
    callers = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            callers |= parse_line(line, number, defaults)
    return callers
