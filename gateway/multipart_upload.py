"""A multipart/form-data upload read as it arrives: its one file's bytes as a stream of chunks, its other
fields (small) kept. Never the whole body in memory or on a spool file: the file's bytes go to the file
store as they come (``gateway.stored_files.write_file``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from gateway.errors import ApiError

FILE_FIELD = "file"
MAX_FIELD_BYTES = 64 * 1024  # a form field other than the file (``purpose``): more is refused


class MultipartUpload:
    """Parse ``request``'s body with ``file_chunks()``; ``fields`` and ``filename`` fill as parts end
    (a field sent before the file is known when the file's first chunk arrives)."""

    def __init__(self, request: Request) -> None:
        kind, options = parse_options_header(request.headers.get("content-type", ""))
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise ApiError(400, "upload the file as multipart/form-data (fields: file, purpose)")
        self.request = request
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.file_seen = False
        self._part: dict = {}
        self._out: list[bytes] = []
        callbacks = {
            "on_part_begin": self._begin,
            "on_header_field": lambda d, s, e: self._header("field", d[s:e]),
            "on_header_value": lambda d, s, e: self._header("value", d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }
        self.parser = MultipartParser(boundary, callbacks)

    async def file_chunks(self) -> AsyncIterator[bytes]:
        """The file part's bytes as they arrive (fields after the file are read too, to the body's end)."""
        async for chunk in self.request.stream():
            self._parse(chunk)
            if self._out:
                out, self._out = b"".join(self._out), []
                yield out
        self._parse(None)
        if not self.file_seen:
            raise ApiError(400, "the upload has no file part (field 'file')", param="file")

    def _parse(self, chunk: bytes | None) -> None:
        """Feed the parser (None: the body's end); a malformed body is the client's error."""
        try:
            if chunk is None:
                self.parser.finalize()
            else:
                self.parser.write(chunk)
        except FormParserError as exc:
            raise ApiError(400, f"the upload is not valid multipart/form-data ({exc})") from None

    def _begin(self) -> None:
        self._part = {"headers": {}, "field": b"", "value": b"", "name": None, "is_file": False, "data": []}

    def _header(self, which: str, data: bytes) -> None:
        self._part[which] += bytes(data)

    def _header_end(self) -> None:
        part = self._part
        part["headers"][part["field"].decode("latin-1").lower()] = part["value"]
        part["field"], part["value"] = b"", b""

    def _headers_finished(self) -> None:
        part = self._part
        _, options = parse_options_header(part["headers"].get("content-disposition", b""))
        part["name"] = options.get(b"name", b"").decode("utf-8", "replace")
        if part["name"] == FILE_FIELD and not self.file_seen:
            part["is_file"], self.file_seen = True, True
            filename = options.get(b"filename")
            self.filename = filename.decode("utf-8", "replace") if filename else None

    def _data(self, data: bytes, start: int, end: int) -> None:
        part = self._part
        if part["is_file"]:
            self._out.append(bytes(data[start:end]))
            return
        part["data"].append(bytes(data[start:end]))
        if sum(map(len, part["data"])) > MAX_FIELD_BYTES:
            raise ApiError(400, f"the form field {part['name']!r} is too long", param=part["name"])

    def _end(self) -> None:
        part = self._part
        if not part["is_file"] and part["name"]:
            self.fields[part["name"]] = b"".join(part["data"]).decode("utf-8", "replace")
