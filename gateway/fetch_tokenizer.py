"""``python -m gateway.fetch_tokenizer SOURCE DEST``: copy only a model's tokenizer files (init container)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

PATTERNS = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
]


def fetch(source: str, dest: str) -> Path:
    target = Path(dest)
    target.mkdir(parents=True, exist_ok=True)
    if source.startswith("builtin:"):
        from dllm_contracts.defaults import ASSETS_DIR  # torch-free: only paths

        source = str(ASSETS_DIR / source.split(":", 1)[1])
    local = Path(source)
    if local.is_dir():
        for name in PATTERNS:
            if (local / name).is_file():
                shutil.copy2(local / name, target / name)
    else:  # an s3:// prefix or a Hub repo (REPO@REVISION pins one), through the cache when it is mounted
        from dllm_contracts.model_source import resolve_model_dir

        snapshot = resolve_model_dir(source, patterns=PATTERNS)
        for name in PATTERNS:
            if (snapshot / name).is_file():
                shutil.copy2(snapshot / name, target / name)
    if not (target / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json found for {source!r}")
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.stderr.write("usage: python -m gateway.fetch_tokenizer SOURCE DEST\n")
        return 2
    try:
        fetch(*args)
    except Exception as exc:  # any failure here must end the init container with one clear line
        sys.stderr.write(f"fetch_tokenizer: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
