"""The gateway's side of a random model (``--model random:PRESET``): the preset's config.json beside the
random presets' tokenizer, in a directory the gateway reads as it reads a checkpoint's (torch-free).

A random model has no tokenizer of its own; it is served with a byte-level one whose special tokens sit at
the presets' ids (``dllm_contracts/assets/random-bytes``), so any text is a prompt and the answer's ids
the tokenizer knows are text too (ids past its vocabulary decode to nothing).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from engine_pod.loading.presets import preset

RANDOM_TOKENIZER = RANDOM_TOKENIZER_DIR
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def random_model_dir(spec: str, root: Path) -> Path:
    """``root/NAME`` for ``random:NAME``: the preset's config and the random presets' tokenizer (rewritten each
    time, so a changed preset or package is picked up). The directory's name is the model's id."""
    name = spec.split(":", 1)[1]
    raw = preset(name)
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for file in TOKENIZER_FILES:
        shutil.copy(RANDOM_TOKENIZER / file, directory / file)
    return directory
