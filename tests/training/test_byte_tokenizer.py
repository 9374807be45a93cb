"""The random presets' byte-level tokenizer (dllm_contracts/assets/random-bytes): what its builder makes
from its seeded text (scripts/make_byte_tokenizer.py wrote the asset), its special tokens at every preset's
ids, and any text, JSON and tool calls included, written and read back."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.model_presets import PRESETS
from engine_pod.loading.tokenizer_files import LazyTokenizer
from engine_pod.training.byte_tokenizer import random_preset_tokenizer


def test_the_asset_is_what_the_builder_makes():
    built = json.loads(random_preset_tokenizer().backend_tokenizer.to_str())
    shipped = json.loads((RANDOM_TOKENIZER_DIR / "tokenizer.json").read_text())
    assert built["model"]["vocab"] == shipped["model"]["vocab"]
    assert built["model"]["merges"] == shipped["model"]["merges"]
    assert built["added_tokens"] == shipped["added_tokens"]


@pytest.mark.parametrize(
    "name", [n for n, p in PRESETS.items() if (p.get("text_config") or p)["vocab_size"] == 1024]
)
def test_every_tiny_presets_special_ids_are_its_special_tokens(name):
    config = PRESETS[name].get("text_config") or PRESETS[name]
    tokenizer = Tokenizer.from_file(str(RANDOM_TOKENIZER_DIR / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    special = {t["id"] for t in json.loads(tokenizer.to_str())["added_tokens"] if t["special"]}
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"):
        if key in config:
            assert config[key] in special, key


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Zoë", "tags": ["a\\"b", 3.5e-2], "ok": null}',
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        "tab\there ✓",
    ],
)
def test_any_text_is_written_and_read_back(text):
    tokenizer = LazyTokenizer(RANDOM_TOKENIZER_DIR)
    assert tokenizer.decode(tokenizer.encode(text)) == text
