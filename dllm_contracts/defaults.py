"""Embedded defaults: the shipped model and the decoding settings every command starts from."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
DEFAULT_MODEL = str(ASSETS_DIR / "tiny-llada")  # where the shipped model lies in this installation
DEFAULT_MODEL_NAME = "builtin:tiny-llada"  # what `--model` defaults to, and what reports record
DEFAULT_BLOCK_LENGTH = 32
DEFAULT_THRESHOLD = 0.9
DEFAULT_TOKEN_BUDGET = 8192
# what a random model (``random:PRESET``) is served with: a byte-level tokenizer whose special tokens sit
# at the presets' ids (scripts/make_byte_tokenizer.py)
RANDOM_TOKENIZER_DIR = ASSETS_DIR / "random-bytes"
