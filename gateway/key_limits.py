"""What each key may do: its tenant, its limits and its priority, from its line of the keys file.

A line of the keys file is a key (or several, separated by commas: each its own tenant with the line's
options), then optionally ``name=value`` options separated by spaces::

    sk-team-a rpm=60 tpm=100000 concurrency=8 batch_lines=50000 storage=1073741824 priority=high tenant=team-a
    sk-team-b
    sk-c,sk-d

A key without an option takes the default of the settings (``DLLM_LIMIT_*``, ``DLLM_STORAGE_QUOTA_BYTES``,
``DLLM_DEFAULT_PRIORITY``); 0 means no limit. A limit is a whole number (``storage``: bytes). ``tenant=NAME`` names the key's tenant, so that a key rotated to a new one (same
``tenant``) keeps its files, batches and limits' counts; without it a key is its own tenant.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from gateway.settings import PRIORITIES, GatewaySettings, SettingsError

LIMIT_OPTIONS = {
    "rpm": "rpm",
    "tpm": "tpm",
    "concurrency": "concurrency",
    "batch_lines": "batch_lines",
    "storage": "storage",
}
MAX_LIMIT = 2**53  # the largest whole number the limits' Lua scripts hold exactly
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DIGITS = re.compile(r"[0-9]+")  # matched whole (fullmatch), ASCII only
_KEY = re.compile(r"[!-~]+")  # what a bearer token in an HTTP header can be (matched whole)


@dataclass(frozen=True)
class Limits:
    rpm: int = 0  # requests per minute (0: none)
    tpm: int = 0  # tokens per minute: prompt and max_tokens of every choice (0: none)
    concurrency: int = 0  # requests in flight (0: none)
    batch_lines: int = 0  # lines of batches not yet ended (0: none)
    storage: int = 0  # bytes of files (uploads and batch outputs) kept at once (0: none)
    priority: str = "normal"  # high, normal or low: its requests' place in the queue's wait-based order

    @classmethod
    def defaults(cls, settings: GatewaySettings) -> Limits:
        return cls(
            rpm=settings.limit_rpm,
            tpm=settings.limit_tpm,
            concurrency=settings.limit_concurrency,
            batch_lines=settings.limit_batch_lines,
            storage=settings.storage_quota_bytes,
            priority=settings.default_priority,
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


def parse_line(line: str, where: str, defaults: Limits) -> dict[str, Caller]:
    """A keys file line's keys with their callers; errors say ``where`` (the file and the line), never a
    key."""
    keys, *options = line.split()
    limits, tenant = defaults, None
    for index, option in enumerate(options, 2):
        name, sep, value = option.partition("=")
        if not sep or not value:  # not echoed: a second key written after a space would be shown
            raise SettingsError(
                f"{where}: word {index} is not NAME=VALUE (keys on one line are separated by commas)"
            )
        if name == "tenant":
            if not _TENANT_NAME.match(value):
                raise SettingsError(f"{where}: tenant {value!r} must be letters, digits, '.', '_', '-'")
            tenant = tenant_of_name(value)
        elif name == "priority":
            if value not in PRIORITIES:
                raise SettingsError(f"{where}: priority {value!r} must be one of {', '.join(PRIORITIES)}")
            limits = replace(limits, priority=value)
        elif name in LIMIT_OPTIONS:
            limits = replace(limits, **{LIMIT_OPTIONS[name]: _whole_number(name, value, where)})
        else:
            known = ", ".join([*LIMIT_OPTIONS, "priority", "tenant"])
            raise SettingsError(f"{where}: unknown option {name!r} (known: {known})")
    named = [key for key in keys.split(",") if key]
    if not all(_KEY.fullmatch(key) for key in named):
        raise SettingsError(f"{where}: a key must be printable ASCII characters (no spaces)")
    return {key: Caller(tenant or tenant_of_key(key), limits) for key in named}


def _whole_number(name: str, value: str, where: str) -> int:
    """A limit's value: digits 0-9 only (``str.isdigit`` also takes "²", which ``int`` refuses)."""
    if not _DIGITS.fullmatch(value):
        raise SettingsError(f"{where}: {name}={value!r} must be a whole number of digits 0-9 (0: no limit)")
    number = int(value)
    if number > MAX_LIMIT:
        raise SettingsError(f"{where}: {name}={value} is past the largest limit, {MAX_LIMIT}")
    return number


def parse_keys(text: str, defaults: Limits, path: str) -> dict[str, Caller]:
    """Every key of the keys file ``path`` whose content is ``text``: blank lines and lines starting with
    ``#`` are skipped."""
    callers = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line and not line.startswith("#"):
            callers |= parse_line(line, where_in(path, number), defaults)
    return callers


def where_in(path: str, number: int) -> str:
    """A line of the keys file, as errors name it."""
    return f"the API keys file {path}, line {number}"


def decode_keys(raw: bytes, path: str) -> str:
    """The keys file's bytes as text (UTF-8, a leading byte-order mark dropped); a byte that is not UTF-8 is
    an error naming its line and column."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SettingsError(
            f"{where_in(path, line)}: byte 0x{raw[exc.start]:02x} at column {exc.start - line_start + 1} is "
            "not UTF-8 (save the file as UTF-8)"
        ) from None
