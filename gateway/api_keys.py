"""The bearer keys a gateway accepts: those of its settings plus a keys file, re-read on SIGHUP.

Keys are on whenever the settings name any key or a keys file, even a file that holds none (every
request is then refused): a missing or emptied file never leaves the API open.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from pathlib import Path

from gateway.settings import GatewaySettings, SettingsError

logger = logging.getLogger(__name__)


def read_keys_file(path: str) -> frozenset[str]:
    """The keys in ``path``: one a line; blank lines and lines starting with ``#`` are skipped."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read the API keys file {path!r}: {exc.strerror or exc}") from None
    lines = (line.strip() for line in text.splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


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
        self.keys = self._load()

    def _load(self) -> frozenset[str]:
        keys = frozenset(self.settings.api_keys)
        if self.settings.api_keys_file:
            keys |= read_keys_file(self.settings.api_keys_file)
        return keys

    def reload(self) -> None:
        """Re-read the keys file (SIGHUP). A file that cannot be read keeps the keys already loaded."""
        try:
            keys = self._load()
        except SettingsError as exc:
            logger.error("%s; keeping the %d keys loaded before", exc, len(self.keys))
            return
        logger.info(
            "API keys reloaded from %s: %d keys (were %d)",
            self.settings.api_keys_file,
            len(keys),
            len(self.keys),
        )
        self.keys = keys

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one of the keys (compared in constant time)."""
        encoded = token.encode()
        return any(hmac.compare_digest(encoded, key.encode()) for key in self.keys)
