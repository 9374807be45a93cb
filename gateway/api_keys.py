"""The bearer keys a gateway accepts, and what each may do: those of its settings plus a keys file (see
``gateway.key_limits`` for its lines' options), re-read on SIGHUP and whenever its content changes
(checked every ``api_keys_reload_s``: a Kubernetes Secret's volume is updated in place, with no signal).

Keys are on whenever the settings name any key or a keys file, even a file that holds none (every
request is then refused): a missing or emptied file never leaves the API open. Content that cannot be
used (a wrong line, a byte that is not UTF-8) stops the start; later, it keeps the keys loaded before and is
logged once, naming the file and the line, and the watcher goes on to the next change.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from pathlib import Path

from gateway.key_limits import Caller, Limits, decode_keys, parse_keys, tenant_of_key
from gateway.settings import GatewaySettings, SettingsError

ANONYMOUS = "anonymous"  # every client's tenant when there are no keys

logger = logging.getLogger(__name__)


def read_keys_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SettingsError(f"cannot read the API keys file {path!r}: {exc.strerror or exc}") from None


def keys_state(settings: GatewaySettings) -> str:
    """What the startup line says about keys (never which)."""
    return "API keys on" if settings.keys_required else "API keys off"


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def exposure_warning(host: str, settings: GatewaySettings) -> str | None:
    """The warning for an API without keys on an address other machines can reach, else None."""
    if settings.keys_required or _loopback(host):
        return None
    return (
        f"serving on {host} without API keys: anyone who can reach this port can use the model and read "
        "every file and batch; set DLLM_API_KEYS or DLLM_API_KEYS_FILE (dllm serve: --api-keys-file)"
    )


class ApiKeys:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.required = settings.keys_required
        self.defaults = Limits.defaults(settings)
        self.anonymous = Caller(ANONYMOUS, self.defaults)
        self.seen = b""  # the keys file's content as last read, loaded or refused
        self.watcher: asyncio.Task | None = None  # the task of ``watch``, once started
        self.callers = self._load()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.callers)

    def _load(self) -> dict[str, Caller]:
        callers = {key: Caller(tenant_of_key(key), self.defaults) for key in self.settings.api_keys}
        path = self.settings.api_keys_file
        if path:
            self.seen = read_keys_file(path)
            callers |= parse_keys(decode_keys(self.seen, path), self.defaults, path)
        return callers

    def reload(self) -> None:
        """Re-read the keys file (SIGHUP, or a change seen). A file that cannot be read or used keeps the
        keys already loaded (logged, with the line at fault)."""
        try:
            callers = self._load()
        except SettingsError as exc:
            logger.error("%s; keeping the %d keys loaded before", exc, len(self.callers))
            return
        logger.info(
            "API keys reloaded from %s: %d keys (were %d)",
            self.settings.api_keys_file,
            len(callers),
            len(self.callers),
        )
        self.callers = callers

    def changed(self) -> bool:
        """Whether the keys file's content differs from what was last read (unreadable: not changed)."""
        try:
            return read_keys_file(self.settings.api_keys_file) != self.seen
        except SettingsError:
            return False

    def start_watching(self) -> asyncio.Task:
        """Start ``watch`` as a task of the running loop (its state is what ``watch_failure`` reports)."""
        self.watcher = asyncio.create_task(self.watch())
        return self.watcher

    async def watch(self) -> None:
        """Reload the keys file whenever its content changes (a Secret's volume swaps its files in). A look
        that fails is logged and the next one made: the watcher never ends on what it reads."""
        period = self.settings.api_keys_reload_s
        while True:
            await asyncio.sleep(period)
            try:
                if await asyncio.to_thread(self.changed):
                    self.reload()
            except Exception:  # noqa: BLE001 (not the content's fault: said with its traceback, then on)
                logger.exception("looking at the API keys file %s failed", self.settings.api_keys_file)

    def watch_failure(self) -> str | None:
        """Why the keys file is no longer watched (its watcher ended), or None while it is or needs none."""
        task = self.watcher
        if task is None or not task.done() or task.cancelled():
            return None
        return f"the API keys file {self.settings.api_keys_file} is no longer watched: {task.exception()!r}"

    def caller(self, token: str) -> Caller | None:
        """Who ``token`` is (compared in constant time with every key), or None for no key of ours."""
        encoded, found = token.encode(), None
        for key, caller in self.callers.items():
            if hmac.compare_digest(encoded, key.encode()):
                found = caller
        return found

    def caller_of(self, authorization: str) -> Caller:
        """The caller of a request whose key was checked already (anonymous without keys)."""
        if not self.required:
            return self.anonymous
        return self.caller(authorization.partition(" ")[2]) or self.anonymous

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one of the keys (compared in constant time)."""
        return self.caller(token) is not None
