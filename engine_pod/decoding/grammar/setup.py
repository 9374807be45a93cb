"""Where a stepper gets its cycle's constrained rows: the model's grammar compiler, made on the first
constrained row (its tokenizer's token trie takes about a second to build for a large vocabulary), and
each row's grammar state, replayed from the answer it committed in earlier cycles (nothing is kept per
request between cycles: a preempted or carried request, or one another worker took over, starts right)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from engine_pod.decoding.grammar.commit_rule import GrammarRow
from engine_pod.decoding.grammar.compiler import GrammarCompiler, GrammarError
from engine_pod.decoding.grammar.rows import ConstrainedRows

logger = logging.getLogger(__name__)


def tokenizer_dir(source: str) -> Path:
    """The directory of the tokenizer a model named ``source`` is served with."""
    return RANDOM_TOKENIZER_DIR if source.startswith("random:") else Path(source)


class GrammarSource:
    """One stepper's grammar compiler (made when first needed) and its constrained rows per cycle."""

    def __init__(self, loaded, logit_candidates: int = 0) -> None:
        self.loaded = loaded
        self.logit_candidates = logit_candidates
        self._compiler: GrammarCompiler | None = None
        self._failure: str | None = None  # why no compiler can be made for this model (it is not retried)

    @property
    def compiler(self) -> GrammarCompiler:
        if self._failure is not None:
            raise GrammarError(self._failure)
        if self._compiler is None:
            try:
                self._compiler = self._make()
            except GrammarError as exc:
                self._failure = str(exc)
                raise
        return self._compiler

    def _make(self) -> GrammarCompiler:
        if self.logit_candidates:
            raise GrammarError(
                "structured outputs need every token's logit; this service scores only "
                f"{self.logit_candidates} candidates per position (--logit-candidates)"
            )
        config = self.loaded.config
        threads = max(1, torch.get_num_threads())
        compiler = GrammarCompiler.from_directory(
            tokenizer_dir(self.loaded.source), config.vocab_size, tuple(config.eos_token_ids), threads
        )
        logger.info("grammar compiler ready (%d vocabulary entries)", config.vocab_size)
        return compiler

    def problem(self, grammar) -> str | None:
        """Why ``grammar`` (a ResponseGrammar) cannot be used here, in one line; None: it compiles."""
        try:
            self.compiler.matcher(grammar.grammar)
        except GrammarError as exc:
            return str(exc)
        return None

    def rows(
        self,
        rows: list,
        blocks: list[list[int | None]],
        device: torch.device,
        heads: list[int] | None = None,
    ) -> ConstrainedRows | None:
        """The cycle's constrained rows (None: there are none) among ``rows`` (its CycleRows); ``blocks``: each row's block as committed
        at the cycle's start (None: not committed), of which the first ``heads`` positions are its prompt's
        (a block on the absolute grid)."""
        wanted = [i for i, row in enumerate(rows) if row.params.grammar is not None and row.active]
        if not wanted:
            return None
        compiler = self.compiler
        constrained = {}
        for i in wanted:
            row = rows[i]
            head, block = (heads[i] if heads else 0), blocks[i]
            frontier = next((k for k, t in enumerate(block) if t is None), len(block))
            answer = list(row.prefix_ids[row.prompt_len :]) + list(block[head:frontier])
            matcher = compiler.matcher(row.params.grammar.grammar)
            constrained[i] = GrammarRow.start(matcher, answer, blocks[i], compiler.eos_ids)
        grammar = ConstrainedRows(compiler, constrained, device)
        for i, grammar_row in constrained.items():  # an answer that ended before: its block is its EOS id
            grammar.pending += [
                (i, k, t) for k, t in enumerate(grammar_row.block) if blocks[i][k] is None and t is not None
            ]
            if grammar_row.complete:
                grammar.completed.append(i)
        return grammar
