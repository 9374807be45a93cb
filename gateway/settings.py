"""Gateway settings: one frozen dataclass, read from the environment only here."""

from __future__ import annotations

import hashlib
import os
import textwrap
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path

from dllm_contracts.model_identity import MODEL_IDENTITY_ENV, MODEL_NAME_ENV, ModelIdentity
from dllm_contracts.model_store_config import S3_ENDPOINT_ENV
from dllm_contracts.queue.connect import REDIS_PASSWORD_ENV
from dllm_contracts.queue.ops import RESULT_TTL_S

MODEL_SCHEMES = ("builtin:", "random:")  # models named as dllm serve takes them (see gateway.model_files)
DEFAULT_FILE_STORE = "~/.cache/dllm/files"  # python -m gateway's; dllm serve and the operator set theirs
EXIT_AFTER_DRAIN_S = 5.0  # after the drain: the lifespan's shutdown (batches handed back, Redis closed), exit


class SettingsError(ValueError):
    """A gateway setting with an unusable value."""


def _setting(default, meaning: str = ""):
    """A setting with its default and what it means (``python -m gateway --help`` lists both)."""
    return field(default=default, metadata={"meaning": meaning})


@dataclass(frozen=True)
class GatewaySettings:
    redis_url: str = _setting("redis://127.0.0.1:6379/0", "the Redis holding the queue")
    service: str = _setting("default", "the service's name: its queue in Redis (a DNS label)")
    model_dir: str = _setting(
        "",
        "the model's directory (tokenizer.json, and config.json for its EOS ids), or a model "
        "dllm serve takes: builtin:NAME, random:PRESET (served with the shipped tokenizer)",
    )
    model_name: str = _setting("", 'the id clients pass as "model"; default: the model directory\'s name')
    api_keys: tuple[str, ...] = _setting(
        (), "bearer keys, comma-separated; with none here and no keys file: no authentication"
    )
    api_keys_file: str = _setting(
        "",
        "a file of bearer keys, one a line, each with its own limits if any (KEY rpm=60 tpm=100000 "
        "concurrency=8 batch_lines=50000 storage=BYTES priority=high tenant=NAME); re-read on SIGHUP and "
        "whenever it changes (content it cannot use keeps the keys loaded before); set: keys are on",
    )
    api_keys_reload_s: float = _setting(
        10.0, "how often the keys file is checked for changes (a Secret's update): 0: on SIGHUP only"
    )
    limit_rpm: int = _setting(
        0, "requests per minute of each key (its tenant) unless its line sets rpm; 0: none"
    )
    limit_tpm: int = _setting(
        0,
        "tokens per minute of each key unless its line sets tpm (a request counts its prompt and its "
        "max_tokens per choice; what was not generated is given back); 0: none",
    )
    limit_concurrency: int = _setting(
        0, "requests in flight of each key unless its line sets concurrency; 0: none"
    )
    limit_batch_lines: int = _setting(
        0,
        "batch lines each key may have queued (batches not ended) unless its line sets batch_lines; 0: none",
    )
    default_priority: str = _setting(
        "normal", "each key's priority unless its line sets one: high, normal or low"
    )
    priority_head_start_s: float = _setting(
        10.0,
        "how much earlier a high-priority request counts as arrived (a low one: later) in the queue's "
        "wait-based order: a normal request is never overtaken by a high one that came this much after it",
    )
    max_queued: int = _setting(10_000, "pending + in-flight requests beyond which new ones get 429")
    retry_after_s: int = 2
    max_prompt_tokens: int = _setting(
        0,
        "the longest prompt, in tokens; 0: whatever fits the context with the request's max_tokens (a "
        "prompt and its max_tokens beyond the context are refused either way: context_length_exceeded)",
    )
    context_length: int = _setting(
        0,
        "the most tokens a prompt and its max_tokens may take together; 0: the model's context (its "
        "config.json's max_position_embeddings, or its family's)",
    )
    max_prompts_per_request: int = _setting(
        64, "prompts in one completions call (more: 400, nothing enqueued)"
    )
    max_tokens_limit: int = _setting(512, "the largest max_tokens a request may ask for")
    default_max_tokens: int = _setting(128, "max_tokens of a request that sets none")
    # the service's decoding settings (requests may not change these)
    block_length: int = _setting(32, "tokens in a block (the worker's decoding setting)")
    steps_per_block: int = _setting(32, "denoising steps per block (the worker's decoding setting)")
    threshold: float = _setting(0.9, "confidence threshold (the worker's; a request may set its own)")
    request_timeout_s: float = _setting(600.0, "a request's deadline: unanswered by then, it fails")
    enqueue_timeout_s: float = _setting(
        10.0, "how long a Redis fault may delay accepting a request before 503"
    )
    drain_timeout_s: float = _setting(
        30.0, "after SIGTERM: time open requests get; streams then end with an error"
    )
    batch_chunk: int = _setting(200, "batch lines queued (and the batch's cursor moved) in one step")
    max_batch_lines: int = _setting(50_000, "request lines in one batch input file (more: 400)")
    result_ttl_s: int = _setting(
        RESULT_TTL_S, "how long a finished request's record and result stay in Redis"
    )
    file_ttl_s: int = _setting(7 * 86400, "how long an uploaded file stays")
    batch_ttl_s: int = _setting(7 * 86400, "how long a batch's record and its results stay")
    max_body_bytes: int = _setting(4 * 1024 * 1024, "a JSON request body larger than this is a 413, unread")
    max_upload_bytes: int = _setting(200 * 1024 * 1024, "a file upload larger than this is a 413")
    file_store: str = _setting(
        DEFAULT_FILE_STORE,
        "where the bytes of uploaded files and batch outputs are kept: a directory (a volume of the "
        "gateway's; every gateway replica must see the same one) or s3://BUCKET/PREFIX (an S3-compatible "
        "bucket; credentials and region from the usual AWS_* variables); Redis keeps only their records",
    )
    s3_endpoint_url: str = _setting(
        "", "the S3-compatible server of an s3:// file store (empty: AWS_ENDPOINT_URL, else AWS)"
    )
    storage_quota_bytes: int = _setting(
        0,
        "the bytes one tenant's files (uploads and batch outputs) may take together, unless its key's "
        "line sets storage; an upload past it is a 400 (code storage_quota_exceeded); 0: no quota",
    )
    max_upload_s: float = _setting(
        3600.0, "an upload not received within this long is a 408; bytes of an unfinished one are swept"
    )
    file_sweep_s: float = _setting(
        60.0, "how often expired files and unfinished uploads are deleted from the file store"
    )
    unknown_fields: str = _setting(
        "reject", 'a body field OpenAI does not define: "reject" (400) or "ignore"'
    )
    batch_window_s: int = _setting(24 * 3600, "a batch's completion window: lines not started by then expire")
    docs: bool = _setting(
        True, "serve /docs, /redoc and /openapi.json (off: the API is not described publicly)"
    )
    access_log: bool = _setting(True, "one log line per HTTP request (uvicorn's access log)")
    forwarded_allow_ips: tuple[str, ...] = _setting(
        ("127.0.0.1", "::1"),
        "proxies (addresses, networks, or *) whose X-Forwarded-For and X-Forwarded-Proto are believed: "
        "a request through one has its client's address in the access log, not the proxy's",
    )
    max_header_bytes: int = _setting(
        64 * 1024, "a request line and headers larger than this: 431, connection closed"
    )
    header_timeout_s: float = _setting(
        10.0, "a request's head not in by then (from its first byte): connection closed"
    )
    metrics_port: int = _setting(
        0,
        "> 0: /metrics is served on this port, without a key (for a scraper inside the cluster), and not "
        "on the API port; 0: /metrics on the API port, behind the API key when there are keys",
    )
    metrics_host: str = _setting("0.0.0.0", "the address /metrics listens on (with a metrics port)")
    processes: int = _setting(
        1,
        "gateway processes sharing the API port (SO_REUSEPORT): each an event loop on a core of its "
        "own; the queue-depth gauge is Redis's and the same in all, request counters are each "
        "process's own",
    )
    model_identity: str = _setting(
        "",
        "NAME@FINGERPRINT of the model served: stamped on every request and batch accepted, so that no "
        "worker of another model answers them (dllm serve and the operator set it); empty: none",
    )
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checks = [
            (self.max_queued >= 1, "max_queued must be positive"),
            (
                min(self.limit_rpm, self.limit_tpm, self.limit_concurrency, self.limit_batch_lines) >= 0,
                "limits (DLLM_LIMIT_*) must not be negative (0: none)",
            ),
            (
                self.default_priority in PRIORITIES,
                f"default_priority must be one of {', '.join(PRIORITIES)}",
            ),
            (self.priority_head_start_s >= 0, "priority_head_start_s must not be negative"),
            (self.api_keys_reload_s >= 0, "api_keys_reload_s must not be negative (0: on SIGHUP only)"),
            (self.max_prompt_tokens >= 0, "max_prompt_tokens must not be negative (0: the context's)"),
            (self.context_length >= 0, "context_length must not be negative (0: the model's)"),
            (self.max_prompts_per_request >= 1, "max_prompts_per_request must be positive"),
            (self.max_batch_lines >= 1, "max_batch_lines must be positive"),
            (self.batch_chunk >= 1, "batch_chunk must be positive"),
            (
                min(self.result_ttl_s, self.file_ttl_s, self.batch_ttl_s) >= 1,
                "retention times (result_ttl_s, file_ttl_s, batch_ttl_s) must be positive",
            ),
            (
                1 <= self.default_max_tokens <= self.max_tokens_limit,
                "default_max_tokens must be in 1..max_tokens_limit",
            ),
            (
                self.block_length >= 1 and self.steps_per_block >= 1,
                "block_length and steps_per_block must be positive",
            ),
            (0 < self.threshold <= 1, "threshold must be in (0, 1]"),
            (self.drain_timeout_s >= 0, "drain_timeout_s must not be negative"),
            (self.enqueue_timeout_s >= 0, "enqueue_timeout_s must not be negative"),
            (0 <= self.metrics_port <= 65535, "metrics_port must be a port number (0: the API port)"),
            (
                min(self.max_body_bytes, self.max_upload_bytes) >= 1024,
                "max_body_bytes and max_upload_bytes must be at least 1024",
            ),
            (
                self.unknown_fields in UNKNOWN_FIELDS,
                f"unknown_fields must be one of {', '.join(UNKNOWN_FIELDS)}",
            ),
            (self.batch_window_s >= 1, "batch_window_s must be positive"),
            (bool(self.file_store.strip()), "file_store must name a directory or an s3:// URL"),
            (self.storage_quota_bytes >= 0, "storage_quota_bytes must not be negative (0: no quota)"),
            (
                self.max_upload_s > 0 and self.file_sweep_s > 0,
                "max_upload_s and file_sweep_s must be positive",
            ),
            (1 <= self.processes <= 256, "processes must be in 1..256"),
            (self.max_header_bytes >= 1024, "max_header_bytes must be at least 1024"),
            (self.header_timeout_s > 0, "header_timeout_s must be positive"),
            (_identity_ok(self.model_identity), f"{MODEL_IDENTITY_ENV} must be NAME@FINGERPRINT"),
        ]
        for ok, message in checks:
            if not ok:
                raise SettingsError(message)

    @property
    def keys_required(self) -> bool:
        """Whether requests need a bearer key: keys given, or a keys file named (even an empty one:
        naming a file never leaves the API open)."""
        return bool(self.api_keys or self.api_keys_file)

    @property
    def stop_within_s(self) -> float:
        """How long after SIGTERM the process may take to end: the drain, then its shutdown (what ``dllm
        serve`` waits for before it kills the gateway, and what a pod's grace period covers)."""
        return self.drain_timeout_s + EXIT_AFTER_DRAIN_S

    @property
    def served_model(self) -> str:
        """The model's id: its name, else its directory's (``builtin:NAME``, ``random:PRESET``: NAME)."""
        named = (
            self.model_dir.split(":", 1)[1] if self.model_dir.startswith(MODEL_SCHEMES) else self.model_dir
        )
        return self.model_name or Path(named).name or "dllm"

    @cached_property
    def system_fingerprint(self) -> str:
        """OpenAI's ``system_fingerprint``: what answers come from, the served model (its weights' identity,
        where set) and the decoding settings; it changes when they do."""
        model = self.model_identity or self.served_model
        served = f"{model}|{self.block_length}|{self.steps_per_block}|{self.threshold}"
        return "fp_" + hashlib.sha256(served.encode()).hexdigest()[:12]

    @classmethod
    def from_env(cls, **overrides) -> GatewaySettings:
        """Settings from ``DLLM_*`` variables (names in ENV_NAMES), defaults for the rest; ``overrides``
        (command-line flags, say) win over both."""
        return cls(**(env_values() | overrides))

    def to_env(self, exclude: tuple[str, ...] = ()) -> dict[str, str]:
        """The ``DLLM_*`` environment that ``from_env`` reads back as these settings: what the operator,
        ``dllm serve`` and the benchmark give a gateway process (``exclude``: fields passed otherwise,
        such as API keys from a Secret)."""
        return {
            variable: _render(getattr(self, name))
            for name, variable in ENV_NAMES.items()
            if name not in exclude
        }


ENV_NAMES = {  # field -> environment variable: the one place a gateway setting's name is defined
    "redis_url": "DLLM_REDIS_URL",
    "service": "DLLM_SERVICE",
    "model_dir": "DLLM_MODEL_DIR",
    "model_name": MODEL_NAME_ENV,
    "api_keys": "DLLM_API_KEYS",
    "api_keys_file": "DLLM_API_KEYS_FILE",
    "api_keys_reload_s": "DLLM_API_KEYS_RELOAD_S",
    "limit_rpm": "DLLM_LIMIT_RPM",
    "limit_tpm": "DLLM_LIMIT_TPM",
    "limit_concurrency": "DLLM_LIMIT_CONCURRENCY",
    "limit_batch_lines": "DLLM_LIMIT_BATCH_LINES",
    "default_priority": "DLLM_DEFAULT_PRIORITY",
    "priority_head_start_s": "DLLM_PRIORITY_HEAD_START_S",
    "max_queued": "DLLM_MAX_QUEUED",
    "max_prompt_tokens": "DLLM_MAX_PROMPT_TOKENS",
    "context_length": "DLLM_CONTEXT_LENGTH",
    "max_prompts_per_request": "DLLM_MAX_PROMPTS",
    "max_tokens_limit": "DLLM_MAX_TOKENS",
    "default_max_tokens": "DLLM_DEFAULT_MAX_TOKENS",
    "block_length": "DLLM_BLOCK_LENGTH",
    "steps_per_block": "DLLM_STEPS_PER_BLOCK",
    "threshold": "DLLM_THRESHOLD",
    "request_timeout_s": "DLLM_REQUEST_TIMEOUT_S",
    "enqueue_timeout_s": "DLLM_ENQUEUE_TIMEOUT_S",
    "drain_timeout_s": "DLLM_DRAIN_TIMEOUT_S",
    "max_batch_lines": "DLLM_MAX_BATCH_LINES",
    "batch_chunk": "DLLM_BATCH_CHUNK",
    "result_ttl_s": "DLLM_RESULT_TTL_S",
    "file_ttl_s": "DLLM_FILE_TTL_S",
    "batch_ttl_s": "DLLM_BATCH_TTL_S",
    "max_body_bytes": "DLLM_MAX_BODY_BYTES",
    "max_upload_bytes": "DLLM_MAX_UPLOAD_BYTES",
    "file_store": "DLLM_FILE_STORE",
    "s3_endpoint_url": S3_ENDPOINT_ENV,  # the same store's URL as s3:// models take
    "storage_quota_bytes": "DLLM_STORAGE_QUOTA_BYTES",
    "max_upload_s": "DLLM_MAX_UPLOAD_S",
    "file_sweep_s": "DLLM_FILE_SWEEP_S",
    "unknown_fields": "DLLM_UNKNOWN_FIELDS",
    "batch_window_s": "DLLM_BATCH_WINDOW_S",
    "docs": "DLLM_DOCS",
    "access_log": "DLLM_ACCESS_LOG",
    "forwarded_allow_ips": "DLLM_FORWARDED_ALLOW_IPS",
    "max_header_bytes": "DLLM_MAX_HEADER_BYTES",
    "header_timeout_s": "DLLM_HEADER_TIMEOUT_S",
    "metrics_port": "DLLM_METRICS_PORT",
    "metrics_host": "DLLM_METRICS_HOST",
    "processes": "DLLM_GATEWAY_PROCESSES",
    "model_identity": MODEL_IDENTITY_ENV,
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _identity_ok(text: str) -> bool:
    try:
        return not text or bool(ModelIdentity.parse(text))
    except ValueError:
        return False


UNKNOWN_FIELDS = ("reject", "ignore")
PRIORITIES = {"high": 1, "normal": 0, "low": -1}  # a key's priority -> the sign of its head start


def env_values() -> dict:
    """The settings the ``DLLM_*`` environment sets (only those: a caller can tell set from default)."""
    return {
        name: _parse(name, os.environ[variable])
        for name, variable in ENV_NAMES.items()
        if variable in os.environ
    }


def _parse(name: str, text: str):
    default = getattr(GatewaySettings, name)
    if isinstance(default, tuple):
        return tuple(part.strip() for part in text.split(",") if part.strip())
    if isinstance(default, bool):  # bool("false") would be True
        if text.strip().lower() not in _TRUE + _FALSE:
            raise SettingsError(f"{ENV_NAMES[name]}={text!r} is not a boolean (true or false)")
        return text.strip().lower() in _TRUE
    try:
        return type(default)(text)
    except ValueError:
        raise SettingsError(f"{ENV_NAMES[name]}={text!r} is not a valid {type(default).__name__}") from None


def _render(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return ",".join(value) if isinstance(value, tuple) else str(value)


def env_help(width: int = 100) -> str:
    """Every variable the gateway reads, with its default and what it means (``python -m gateway --help``),
    from the settings class itself."""
    described = {item.name: item for item in fields(GatewaySettings)}
    lines = ["environment (the gateway's settings; a variable not set takes its default):"]
    for name, variable in ENV_NAMES.items():
        setting = described[name]
        default = _render(setting.default)
        value = f"={default}" if default else " (required)" if name in REQUIRED else " (unset)"
        lines.append(f"  {variable}{value}")
        meaning = setting.metadata.get("meaning", "")
        lines += textwrap.wrap(meaning, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
    lines += [
        f"  {REDIS_PASSWORD_ENV} (unset)",
        f"      Redis's password, where {ENV_NAMES['redis_url']} has none",
    ]
    return "\n".join(lines)


REQUIRED = ("model_dir",)  # settings without which the gateway does not start


def missing_setting(name: str) -> SettingsError:
    """The error for a required setting left unset: names its variable, in one line."""
    return SettingsError(f"{ENV_NAMES[name]} is not set: set it to {_MISSING[name]}")


_MISSING = {
    "model_dir": "the model's directory (with its tokenizer.json), or a model dllm serve takes: "
    "builtin:NAME or random:PRESET",
}
