"""Model loading reads a checkpoint's EOS ids without transformers, as transformers' tokenizer gives them,
and loads the tokenizer only when something uses it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from dllm_contracts.model_source import builtin_model_dir
from engine_pod.loading.loader import load_model
from engine_pod.loading.tokenizer_files import _END_TOKENS, LazyTokenizer, _end_token_ids, _load_tokenizer


def _by_transformers(model_dir) -> list[int]:
    tokenizer = _load_tokenizer(model_dir)
    vocab = tokenizer.get_vocab()
    return [tokenizer.eos_token_id, *(vocab[token] for token in _END_TOKENS if token in vocab)]


@pytest.mark.parametrize(
    "eos", [None, "<|user|>", {"__type": "AddedToken", "content": "<|assistant|>", "special": True}]
)
def test_end_token_ids_are_the_ones_transformers_reads(tmp_path, eos):
    model_dir = tmp_path / "model"
    shutil.copytree(builtin_model_dir("tiny-llada"), model_dir)
    if eos is not None:
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) | {"eos_token": eos}
        config_path.write_text(json.dumps(config))
    assert _end_token_ids(model_dir) == _by_transformers(model_dir)


def test_the_tokenizer_loads_on_first_use():
    loaded = load_model("builtin:tiny-llada")
    assert isinstance(loaded.tokenizer, LazyTokenizer) and loaded.tokenizer._tokenizer is None
    assert loaded.tokenizer.decode(loaded.tokenizer("count to 3 .")["input_ids"]) == "count to 3 ."
    assert loaded.tokenizer._tokenizer is not None


_GENERATE_THEN_LIST_SYMPY = """
import sys
from engine_pod.cli.main import main
for model in ("builtin:tiny-llada", "builtin:tiny-llada2-random"):
    argv = ["generate", "--model", model, "--prompt", "count to 5 .", "--gen-length", "32", "--threads", "1"]
    assert main(argv) == 0
print(sorted(name for name in sys.modules if name.split(".")[0] == "sympy")[:3])
"""


def test_loading_and_generating_do_not_import_sympy():
    """A meta-built model is given storage without torch's meta reference path, which imports sympy (about
    half a CPU second, over a second for the mixture of experts, in every process that loads a model)."""
    done = subprocess.run(
        [sys.executable, "-c", _GENERATE_THEN_LIST_SYMPY], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]
