"""Where the bytes of files live (uploads, and batches' output and error files): a store of named objects.

Redis keeps a file's record (``gateway.stored_files``); the store keeps its bytes, under the name
``<service>/<file id>``. A store writes an object whole or not at all: a writer's bytes become visible
under the name only when it commits (a file renamed into place, an S3 multipart upload completed), so a
gateway killed while writing leaves partial bytes that only the sweeper sees (``sweep_partial``).

Two stores: a directory (``FilesystemStore``, the default: a volume of the gateway's) and an
S3-compatible bucket (``gateway.s3_store``), chosen by the ``file_store`` setting. Their methods block
(disk or network); the gateway calls them in threads.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path
from typing import BinaryIO, Protocol

CHUNK = 1 << 20  # bytes read or written at a time: a download's memory is a few of these
PARTIAL = ".partial"  # the directory (under the store's root) of files being written


class ObjectWriter(Protocol):
    def write(self, data: bytes) -> None: ...

    def commit(self) -> None:
        """Make the bytes written visible under the object's name (replacing what was there), durably."""

    def abort(self) -> None:
        """Drop what was written (idempotent)."""


class FileStore(Protocol):
    def writer(self, name: str) -> ObjectWriter: ...

    def reader(self, name: str) -> BinaryIO:
        """The object's bytes (``read(n)``, ``close()``); ``FileNotFoundError`` when it does not exist."""

    def delete(self, name: str) -> None:
        """Remove the object; nothing happens when it does not exist."""

    def size(self, name: str) -> int | None:
        """The object's size in bytes, None when it does not exist."""

    def sweep_partial(self, older_than_s: float, writing: set[str]) -> int:
        """Remove writes left unfinished (a process killed while writing) untouched for ``older_than_s``,
        except those of the objects named in ``writing`` (uploads under way); how many were removed."""

    def describe(self) -> str: ...


def open_store(location: str, s3_endpoint_url: str = "") -> FileStore:
    """The store the ``file_store`` setting names: ``s3://BUCKET[/PREFIX]``, else a directory."""
    if location.startswith("s3://"):
        try:
            from gateway.s3_store import S3Store  # boto3 is imported only by a gateway that uses S3
        except ImportError:
            raise ValueError("an s3:// file store needs boto3 (pip install boto3)") from None
        return S3Store(location, s3_endpoint_url)
    return FilesystemStore(Path(location).expanduser())


class FilesystemStore:
    """Objects as files under ``root``: written to ``root/.partial/`` then fsynced and renamed into place
    (a rename within one filesystem is atomic), the directory fsynced after the rename and the delete."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        (self.root / PARTIAL).mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if self.root not in path.parents or PARTIAL in path.parts:
            raise ValueError(f"object name {name!r} leaves the store")
        return path

    def writer(self, name: str) -> _FileWriter:
        final = self._path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        partial = self.root / PARTIAL / f"{_partial_prefix(name)}.{secrets.token_hex(6)}"
        return _FileWriter(partial, final)

    def reader(self, name: str) -> BinaryIO:
        return open(self._path(name), "rb")  # noqa: SIM115 (the caller closes it)

    def delete(self, name: str) -> None:
        path = self._path(name)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            _fsync_dir(path.parent)

    def size(self, name: str) -> int | None:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            return None

    def sweep_partial(self, older_than_s: float, writing: set[str]) -> int:
        cutoff, removed = time.time() - older_than_s, 0
        live = {_partial_prefix(name) for name in writing}
        for path in (self.root / PARTIAL).iterdir():
            if path.name.rsplit(".", 1)[0] in live:
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed


class _FileWriter:
    def __init__(self, partial: Path, final: Path) -> None:
        self.partial, self.final = partial, final
        self.file = open(partial, "wb")  # noqa: SIM115 (closed by commit or abort)

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.partial, self.final)
        _fsync_dir(self.final.parent)

    def abort(self) -> None:
        self.file.close()
        with contextlib.suppress(FileNotFoundError):
            self.partial.unlink()


def _partial_prefix(name: str) -> str:
    return name.replace("/", "_")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
