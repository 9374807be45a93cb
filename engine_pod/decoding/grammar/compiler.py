"""Response grammars compiled for one model's tokenizer with llguidance (chosen by measurement:
docs/benchmarks.md#grammar-engines), the compiled ones kept.

A grammar (dllm_contracts/structured_output.py) compiles once per worker into a template matcher (the
grammar, its lexer and the tokenizer's token trie); each constrained row gets a copy of the template, whose
state is that row's answer so far. The template cache is bounded (least recently used out). llguidance is
imported on first use: it ships with the ``serve`` extra.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CACHED_GRAMMARS = 256  # compiled grammars kept per worker
UTF8_BYTES = set(range(0xF5))  # the bytes UTF-8 text may hold (llguidance keeps 0xFF for special tokens)


class GrammarError(ValueError):
    """A grammar that cannot be used: it does not compile, or the model has no tokenizer for it."""


class GrammarCompiler:
    """Compiles grammars for one tokenizer; ``matcher`` hands out a fresh matcher of a cached template."""

    def __init__(
        self, tokenizer_json: str, vocab_size: int, eos_ids: tuple[int, ...], threads: int = 1
    ) -> None:
        llg = _llguidance()
        if not eos_ids:
            raise GrammarError("the model names no end-of-sequence token: an answer could never end")
        self.llg = llg
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        try:
            self.tokenizer = llg.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_ids))
        except ValueError as exc:
            raise GrammarError(
                f"structured outputs need a tokenizer that can write any text; this model's cannot be used ({exc})"
            ) from None
        missing = len(UTF8_BYTES - self._single_bytes())
        if missing:
            raise GrammarError(
                f"this model's tokenizer cannot write {missing} of the {len(UTF8_BYTES)} bytes UTF-8 text is "
                "made of (it is not byte-level): structured outputs need one that can write any text"
            )
        self.executor = llg.LLExecutor(num_threads=max(1, threads))
        self.words = (vocab_size + 31) // 32  # a bitmask row: one bit per vocabulary entry, in int32 words
        self._templates: OrderedDict[str, Any] = OrderedDict()
        self.compiled = 0  # grammars compiled (misses of the cache)

    @classmethod
    def from_directory(
        cls, directory: Path, vocab_size: int, eos_ids: tuple[int, ...], threads: int = 1
    ) -> GrammarCompiler:
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise GrammarError(
                f"{directory} has no tokenizer.json: structured outputs need the model's tokenizer"
            )
        return cls(path.read_text(), vocab_size, eos_ids, threads)

    def _single_bytes(self) -> set[int]:
        """The bytes some token writes alone (a byte-level tokenizer's: every one)."""
        found = set()
        for token in range(self.tokenizer.vocab_size):
            written = self.tokenizer.decode_bytes([token])
            if len(written) == 1:
                found.add(written[0])
        return found

    def matcher(self, grammar: str) -> Any:
        """A matcher at the start of ``grammar`` (an ``LLMatcher``); GrammarError if it does not compile."""
        template = self._templates.get(grammar)
        if template is None:
            template = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
            if template.is_error():
                raise GrammarError(f"the response grammar does not compile: {template.get_error()}")
            self.compiled += 1
            self._templates[grammar] = template
            while len(self._templates) > CACHED_GRAMMARS:
                self._templates.popitem(last=False)
        self._templates.move_to_end(grammar)
        return template.deep_copy()

    def fill_masks(self, matchers: list[Any], out) -> None:
        """Every matcher's next-token bitmask into ``out`` (a C-contiguous int32 numpy array [n, words]),
        row i for ``matchers[i]``, computed together on the executor's threads."""
        if matchers:
            self.executor.unsafe_compute_mask_ptr(
                [(m, i) for i, m in enumerate(matchers)], out.ctypes.data, self.words * 4, out.shape[0]
            )


def _llguidance():
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - the serve extra installs it
        raise GrammarError("structured outputs need llguidance: pip install 'dllm-serve[serve]'") from exc
    return llguidance
