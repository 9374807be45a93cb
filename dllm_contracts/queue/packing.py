"""Redis commands packed by hiredis's C encoder on the asyncio client: redis-py packs them in Python there
(its blocking client uses hiredis already), which was a tenth of the gateway's CPU per request."""

from __future__ import annotations

import hiredis


class HiredisPacking:
    """Mixin for redis-py's asyncio connection classes (``connections.py`` puts it in each)."""

    def pack_command(self, *args):
        if isinstance(args[0], str) and " " in args[0]:  # "CONFIG GET" and the like: redis-py splits them
            return super().pack_command(*args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a type hiredis does not encode (redis-py's encoder decides, or refuses)
            return super().pack_command(*args)
