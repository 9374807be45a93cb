"""A keys file laid out as the kubelet writes a Kubernetes Secret's volume (the serving tests' keys files)."""

from __future__ import annotations

from pathlib import Path


class SecretVolume:
    """A directory as the kubelet writes a Secret: ``keys`` -> ``..data/keys``, ``..data`` -> a dated
    directory, replaced by renaming a new symlink over it (no file is ever written in place)."""

    def __init__(self, root: Path) -> None:
        self.root, self.version = root, 0

    @property
    def path(self) -> Path:
        return self.root / "keys"

    def write(self, text: str | bytes) -> None:
        """The file's new content: text (UTF-8) or bytes as they are (a byte that is not UTF-8, say)."""
        self.version += 1
        dated = self.root / f"..2026_{self.version}"
        dated.mkdir()
        (dated / "keys").write_bytes(text.encode() if isinstance(text, str) else text)
        (self.root / "..data_tmp").symlink_to(dated.name)
        (self.root / "..data_tmp").rename(self.root / "..data")
        if not self.path.is_symlink():
            self.path.symlink_to("..data/keys")
