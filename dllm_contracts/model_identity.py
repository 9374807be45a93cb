"""Which model a queue's work belongs to: a served model's name and a fingerprint of its files.

``dllm serve`` records the identity it serves in the queue's Redis and refuses to start another model
over work accepted for the one recorded; the gateway stamps every request (and every batch) with the
identity it accepted it for, and a worker refuses a request stamped for another model instead of
answering it with the wrong weights. Torch-free: the gateway and ``dllm serve`` compute it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

MODEL_IDENTITY_ENV = "DLLM_MODEL_IDENTITY"  # the identity a gateway stamps requests with (NAME@FINGERPRINT)
MODEL_NAME_ENV = "DLLM_MODEL_NAME"  # the served model's name (clients' "model"; the metrics' model label)
FINGERPRINT_CHARS = 16  # hex digits kept: 64 bits tell checkpoints apart
SAMPLES_PER_FILE = 16  # slices of each weights file read (its size, header and these: not the whole file)
SAMPLE_BYTES = 64 * 1024
ON_MODEL_CHANGE = ("refuse", "fail")  # what a start with another model does with the work waiting
DESCRIBING_FILES = ("config.json", "tokenizer.json", "generation_config.json")


@dataclass(frozen=True)
class ModelIdentity:
    name: str  # the served model's name (what clients pass as "model")
    fingerprint: str  # hex digest of its files; "" where none could be taken

    def __post_init__(self) -> None:
        if not self.name or "@" in self.name:
            raise ValueError(f"a model identity needs a name without '@', not {self.name!r}")

    def __str__(self) -> str:
        """As a line says it: ``tiny-llada (weights 3f2a...)``."""
        return f"{self.name} (weights {self.fingerprint})" if self.fingerprint else self.name

    @property
    def text(self) -> str:
        """As it travels in a payload or a variable: ``NAME@FINGERPRINT``."""
        return f"{self.name}@{self.fingerprint}"

    @classmethod
    def parse(cls, text: str) -> ModelIdentity:
        name, _, fingerprint = text.partition("@")
        return cls(name, fingerprint)

    @classmethod
    def of(cls, name: str, model_dir: Path | str) -> ModelIdentity:
        return cls(name, fingerprint(Path(model_dir)))


def model_mismatch(accepted_for: str | None, served: ModelIdentity | None) -> str | None:
    """Why a request accepted for ``accepted_for`` (NAME@FINGERPRINT) must not be answered by a worker
    serving ``served``; None when it may (either side without an identity: nothing to tell apart)."""
    if not accepted_for or served is None:
        return None
    wanted = ModelIdentity.parse(accepted_for)
    if wanted == served:
        return None
    return (
        f"this request was accepted for the model {wanted}, and the service now serves {served}: "
        "send it again"
    )


def fingerprint(model_dir: Path) -> str:
    """A digest of what makes a checkpoint answer as it does: its config, tokenizer and generation config
    whole, and of each ``*.safetensors`` file its name, size, header (every tensor's name, type, shape and
    place) and evenly spaced slices of its data. Reads about a megabyte per weights file, so it is cheap
    for a checkpoint of any size, and two checkpoints differ in it unless they agree in every slice."""
    digest = hashlib.sha256()
    for name in DESCRIBING_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        digest.update(path.name.encode() + b"\0")
        _weights_digest(path, digest)
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def _weights_digest(path: Path, digest) -> None:
    size = path.stat().st_size
    digest.update(struct.pack("<Q", size))
    with path.open("rb") as weights:
        head = weights.read(8)
        header_bytes = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        digest.update(head + weights.read(min(header_bytes, size)))
        for index in range(SAMPLES_PER_FILE):
            weights.seek(size * index // SAMPLES_PER_FILE)
            digest.update(weights.read(SAMPLE_BYTES))


@dataclass(frozen=True)
class ServedRecord:
    """What the queue's Redis keeps of the model last served on it (``ServiceKeys.served_model``)."""

    identity: ModelIdentity
    source: str  # the model as it was named to ``dllm serve --model`` (to serve it again)

    def to_json(self) -> str:
        return json.dumps({"identity": self.identity.text, "source": self.source})

    @classmethod
    def from_json(cls, text: str | bytes) -> ServedRecord:
        data = json.loads(text)
        return cls(ModelIdentity.parse(data["identity"]), str(data.get("source", "")))
