"""The commit rule of constrained rows (decoding/grammar/commit_rule.py) with llguidance on the random
presets' tokenizer, and the constrained rows' device helpers: a frontier token is consumed, the positions
after it are committed while confident and accepted, tokens the grammar forces are committed whatever the
model proposed, an end only where the grammar accepts one (then the block's rest is that EOS id), and a
row replayed from its answer so far continues where it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_contracts.defaults import RANDOM_TOKENIZER_DIR
from dllm_contracts.structured_output import json_grammar
from engine_pod.decoding.grammar.commit_rule import GrammarRow
from engine_pod.decoding.grammar.compiler import GrammarCompiler, GrammarError
from engine_pod.decoding.grammar.device import GrammarStep, allowed_tokens
from engine_pod.loading.tokenizer_files import LazyTokenizer

EOS = 1001
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler.from_directory(RANDOM_TOKENIZER_DIR, 1024, (EOS,))


@pytest.fixture(scope="module")
def tokenizer():
    return LazyTokenizer(RANDOM_TOKENIZER_DIR)


def _row(compiler, answer=(), length=8):
    return GrammarRow.start(compiler.matcher(json_grammar(SCHEMA)), list(answer), [None] * length, (EOS,))


def test_forced_tokens_are_committed_and_an_unconfident_or_rejected_proposal_stops_the_walk(
    compiler, tokenizer
):
    row = _row(compiler)
    opening = tokenizer.encode('{"')
    nothing = [0] * 8
    commits = row.commit(opening[0], nothing, [False] * 8)
    text = tokenizer.decode([t for t in row.block if t is not None])
    assert text.startswith('{"n":')  # the key and its separator: forced by the grammar
    assert [k for k, _ in commits] == list(range(1, row.frontier))
    frontier = row.frontier
    digit = tokenizer.encode(" 7")[0]
    proposals = [0] * 8
    proposals[frontier + 1] = tokenizer.encode("x")[0]  # after the frontier: rejected by the grammar
    row.commit(digit, proposals, [True] * 8)
    assert row.frontier == frontier + 1  # the walk stopped at the rejected proposal


def test_an_end_only_where_the_grammar_accepts_one_then_eos_fills_the_block(compiler, tokenizer):
    row = _row(compiler, tokenizer.encode('{"n": '), length=6)
    proposals = [0] * 6
    proposals[1] = EOS  # an end before the object closes: refused
    row.commit(tokenizer.encode("4")[0], proposals, [True] * 6)
    assert row.frontier == 1 and not row.ended
    commits = row.commit(tokenizer.encode("}")[0], proposals, [False] * 6)
    assert row.ended and row.complete and row.block[2:] == [EOS] * 4  # a whole answer: its end is forced
    assert commits == [(k, EOS) for k in range(2, 6)]


def test_a_token_the_mask_would_not_allow_at_the_frontier_is_a_bug_not_a_commit(compiler, tokenizer):
    row = _row(compiler)
    with pytest.raises(RuntimeError, match="refused token"):
        row.commit(tokenizer.encode("x")[0], [0] * 8, [False] * 8)


def test_a_row_replayed_from_its_answer_continues_where_it_was(compiler, tokenizer):
    answer = tokenizer.encode('{"n": 3')
    first = _row(compiler, answer)
    again = _row(compiler, answer)
    closing = tokenizer.encode("}")[0]
    assert first.commit(closing, [0] * 8, [False] * 8) == again.commit(closing, [0] * 8, [False] * 8)
    ended = _row(compiler, [*answer, closing, EOS])
    assert ended.ended and ended.complete and ended.block == [EOS] * 8


def test_masks_unpack_to_the_tokens_the_grammar_allows(compiler, tokenizer):
    matcher = compiler.matcher(json_grammar(SCHEMA))
    matcher.consume_tokens(tokenizer.encode('{"n": '))
    words = np.zeros((1, compiler.words), dtype=np.int32)
    compiler.fill_masks([matcher], words)
    allowed = allowed_tokens(torch.from_numpy(words), compiler.vocab_size)[0]
    expected = [t for t in range(compiler.vocab_size) if matcher.validate_tokens([t]) == 1]
    assert allowed.nonzero()[:, 0].tolist() == expected
    assert all(tokenizer.decode([t])[0].isdigit() for t in expected)


def test_a_constrained_row_commits_its_frontier_alone():
    transfer = torch.ones(3, 4, dtype=torch.bool)
    step = GrammarStep(
        places=torch.tensor([1]),
        frontier=torch.tensor([2]),
        first_candidate=torch.tensor([0]),
        words=torch.zeros(1, 1, dtype=torch.int32),
        threshold=torch.tensor([0.5]),
        vocab=32,
        count=1,
    )
    restricted = step.restrict(transfer)
    assert restricted[1].tolist() == [False, False, True, False]
    assert restricted[[0, 2]].all()  # free rows: the policy's choice, untouched


def test_a_tokenizer_that_cannot_write_every_byte_is_refused_by_name(tmp_path):
    from dllm_contracts.defaults import DEFAULT_MODEL

    with pytest.raises(GrammarError, match="tokenizer"):
        GrammarCompiler.from_directory(tmp_path, 1024, (EOS,))  # no tokenizer.json at all
    with pytest.raises(GrammarError, match="tokenizer"):
        GrammarCompiler.from_directory(DEFAULT_MODEL, 320, (2,))  # the shipped model's word-level one
