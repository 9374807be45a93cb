"""A checkpoint's tokenizer, loaded on first use, and the EOS ids its directory names (config.json's,
generation_config.json's and the tokenizer's end-of-turn tokens)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dllm_contracts.model_source import ModelLoadError
from engine_pod.families.registry import family_of

logger = logging.getLogger(__name__)

_END_TOKENS = ("<|eot_id|>", "<|endoftext|>", "<|im_end|>", "<eos>")


def eos_ids(config: Any, model_dir: Path | None) -> tuple[int, ...]:
    if not family_of(
        config
    ).eos_from_directory:  # its config's alone (DiffusionGemma: its generation config's)
        return config.eos_token_ids
    ids = list(config.eos_token_ids)
    generation = model_dir / "generation_config.json" if model_dir else None
    if generation is not None and generation.is_file():
        value = json.loads(generation.read_text()).get("eos_token_id")
        ids += value if isinstance(value, list) else ([value] if value is not None else [])
    if model_dir is not None and has_tokenizer(model_dir):
        ids += _end_token_ids(model_dir)
    return tuple(dict.fromkeys(int(i) for i in ids if i != config.mask_token_id))


def has_tokenizer(model_dir: Path) -> bool:
    return any((model_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))


class LazyTokenizer:
    """The directory's transformers tokenizer, loaded on first use: loading transformers costs about a
    second, which a process that only runs the model (a profiling child, a worker) need not pay."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._tokenizer: Any = None

    def load(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = _load_tokenizer(self.model_dir)
            if self._tokenizer is None:
                raise ModelLoadError(f"could not load the tokenizer from {self.model_dir}")
        return self._tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.load(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


def _end_token_ids(model_dir: Path) -> list[int]:
    """The tokenizer's EOS and end-of-turn ids, read from its files with ``tokenizers`` (no transformers);
    the transformers tokenizer answers where the directory has no tokenizer.json."""
    if not (model_dir / "tokenizer.json").is_file():
        tokenizer = _load_tokenizer(model_dir)
        if tokenizer is None:
            return []
        vocab, eos = tokenizer.get_vocab(), tokenizer.eos_token
    else:
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)
        eos = _configured_eos(model_dir)
    return [vocab[token] for token in (eos, *_END_TOKENS) if token is not None and token in vocab]


def _configured_eos(model_dir: Path) -> str | None:
    """The EOS token's text, as tokenizer_config.json (or special_tokens_map.json) names it."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model_dir / name
        value = json.loads(path.read_text()).get("eos_token") if path.is_file() else None
        value = value.get("content") if isinstance(value, dict) else value
        if value:
            return value
    return None


def _load_tokenizer(model_dir: Path) -> Any:
    if not has_tokenizer(model_dir):
        return None
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # it warns about our model_type, which it does not know
    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # a broken tokenizer should not stop id-level use of the model
        logger.warning("could not load the tokenizer from %s: %s", model_dir, exc)
        return None
