"""The bearer keys a gateway accepts, and what each may do: those of its settings plus a keys file (see
``gateway.key_limits`` for its lines' options), re-read on SIGHUP and whenever its content changes
(checked every ``api_keys_reload_s``: a Kubernetes Secret's volume is updated in place, with no signal).

Keys are on whenever the settings name any key or a keys file, even a file that holds none (every
request is then refused): a missing or emptied file never leaves the API open.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from pathlib import Path

from gateway.key_limits import Caller, Limits, parse_keys, tenant_of_key
from gateway.settings import GatewaySettings, SettingsError

ANONYMOUS = "anonymous"  # every client's tenant when there are no keys

logger = logging.getLogger(__name__)


def read_keys_text(path: str) -> str:
    try:
        return Path(path).read_text()
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
        self.text = ""  # the keys file's content as last loaded
        self.callers = self._load()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.callers)

    def _load(self) -> dict[str, Caller]:
        callers = {key: Caller(tenant_of_key(key), self.defaults) for key in self.settings.api_keys}
        if self.settings.api_keys_file:
            self.text = read_keys_text(self.settings.api_keys_file)
            callers |= parse_keys(self.text, self.defaults)
        return callers

    def reload(self) -> None:
        """Re-read the keys file (SIGHUP, or a change seen). A file that cannot be read or has a wrong line
        keeps the keys already loaded."""
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
        """Whether the keys file's content differs from what was loaded (unreadable: not changed)."""
        try:
            return read_keys_text(self.settings.api_keys_file) != self.text
        except SettingsError:
            return False

    async def watch(self) -> None:
        """Reload the keys file whenever its content changes (a Secret's volume swaps its files in)."""
        period = self.settings.api_keys_reload_s
        while True:
            await asyncio.sleep(period)
            if await asyncio.to_thread(self.changed):
                self.reload()

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
