"""The bearer keys a gateway accepts: those of its settings plus a keys file, re-read on SIGHUP.

Keys are on whenever the settings name any key or a keys file, even a file that holds none (every
request is then refused): a missing or emptied file never leaves the API open.
"""

from __future__ import annotations

import hmac
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
        logger.info("API keys reloaded: %d keys (were %d)", len(keys), len(self.keys))
        self.keys = keys

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is one of the keys (compared in constant time)."""
        encoded = token.encode()
        return any(hmac.compare_digest(encoded, key.encode()) for key in self.keys)
