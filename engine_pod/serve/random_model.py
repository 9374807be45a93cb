"""The gateway's side of a random model (``--model random:PRESET``): the preset's config.json beside the
shipped model's tokenizer, in a directory the gateway reads as it reads a checkpoint's (torch-free).

A random model has no tokenizer of its own; with the shipped one, prompts are its words and the answer's
ids that the tokenizer knows are words too (ids past its vocabulary decode to nothing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dllm_contracts.defaults import ASSETS_DIR
from engine_pod.loading.presets import preset

SHIPPED_TOKENIZER = ASSETS_DIR / "tiny-llada"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def random_model_dir(spec: str, root: Path) -> Path:
    """``root/NAME`` for ``random:NAME``: the preset's config and the shipped tokenizer (rewritten each
    time, so a changed preset or package is picked up). The directory's name is the model's id."""
    name = spec.split(":", 1)[1]
    raw = preset(name)
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for file in TOKENIZER_FILES:
        shutil.copy(SHIPPED_TOKENIZER / file, directory / file)
    return directory
