"""A batch input file's request lines, read from the file store as a stream: split at line ends only
(\\n, \\r\\n, \\r), never inside a JSON string, blank lines skipped. What a batch's ``total`` counts and
its ingestion cursor indexes; memory holds one read (``CHUNK``) and the line being read."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from gateway.file_store import CHUNK


def iter_lines(reader: BinaryIO) -> Iterator[str]:
    pending = b""
    while chunk := reader.read(CHUNK):
        parts = (pending + chunk).splitlines(keepends=True)
        last = parts[-1]
        # a last line without its end, or ending in \r that a \n in the next read may complete, waits
        pending = parts.pop() if not last.endswith(b"\n") else b""
        yield from _texts(parts)
    yield from _texts(pending.splitlines())


def _texts(parts: list[bytes]) -> Iterator[str]:
    for part in parts:
        if part.strip():
            yield part.rstrip(b"\r\n").decode(errors="replace")


def input_lines(content: bytes | str) -> list[str]:
    """The request lines of a whole input file held in memory."""
    raw = content.encode() if isinstance(content, str) else content
    return [line.decode(errors="replace") for line in raw.splitlines() if line.strip()]


def count_lines(reader: BinaryIO, limit: int) -> tuple[int, tuple[str, int, int] | None]:
    """The number of request lines, and the first ``custom_id`` two of the first ``limit`` lines share
    with the numbers of both (from 1), None when there is none."""
    count, first_line, duplicate = 0, {}, None
    for count, text in enumerate(iter_lines(reader), 1):
        if count > limit or duplicate is not None:
            continue
        custom_id = given_custom_id(text)
        if custom_id is not None:
            first = first_line.setdefault(custom_id, count)
            if first != count:
                duplicate = (custom_id, first, count)
    return count, duplicate


def duplicate_custom_id(lines: Iterable[str]) -> tuple[str, int, int] | None:
    """The first ``custom_id`` two lines share, with the numbers of both lines (from 1); None when every
    line's is its own. Lines without one (or not JSON) are left to ingestion, which reports them."""
    first_line: dict[str, int] = {}
    for number, text in enumerate(lines, 1):
        custom_id = given_custom_id(text)
        if custom_id is None:
            continue
        first = first_line.setdefault(custom_id, number)
        if first != number:
            return custom_id, first, number
    return None


def given_custom_id(text: str) -> str | None:
    try:
        line = json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # not JSON, or nested deeper than Python parses
        return None
    custom_id = line.get("custom_id") if isinstance(line, dict) else None
    return None if custom_id is None else str(custom_id)
