"""Variable-length attention for packed batches: each row's queries attend over that row's keys only.

Queries and keys of all rows are concatenated (no padding): query row r is ``q[q_start[r]:][:q_len[r]]``
and its keys ``k[k_start[r]:][:k_len[r]]``. Rows are grouped by length and each group runs as one
SDPA call over a box no wider than its widest row, where the rows' lengths differ by at most
``LENGTH_TOLERANCE`` (sorted, greedy): the work spent on the few positions that pad a group is bounded
by that share, and the number of calls stays small (on the CPU a call per row would cost more in
overhead than the padding it saves). Padding entries read an extra zero row and are masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_pod.models.layers import attend

LENGTH_TOLERANCE = 0.1  # a group's rows are at least (1 - this) x its widest row


def starts_of(lengths: list[int]) -> list[int]:
    """Where each of consecutive spans of these lengths starts."""
    starts = [0] * len(lengths)
    for i in range(1, len(lengths)):
        starts[i] = starts[i - 1] + lengths[i - 1]
    return starts


@dataclass(frozen=True)
class RowSpans:
    """Where each row's queries and keys lie in the packed tensors (host-side lists, one per row)."""

    q_start: list[int]
    q_len: list[int]
    k_start: list[int]
    k_len: list[int]

    @property
    def queries(self) -> int:
        return sum(self.q_len)


@dataclass(frozen=True)
class _Group:
    q_read: (
        torch.Tensor | None
    )  # [Rg, Tq] packed queries to read (padding: any real one); None: all, in order
    q_write: torch.Tensor | None  # [Rg, Tq] where outputs go (padding: the discarded extra row)
    k_index: torch.Tensor  # [Rg, Tk] packed keys (padding: any real one, masked out)
    k_valid: torch.Tensor | None  # [Rg, Tk] False on padding keys; None where no row is padded
    shape: tuple[int, int]  # (Rg, Tq)


def _grouped_rows(spans: RowSpans) -> list[list[int]]:
    """Rows sorted by key length (then query length) and cut into groups within the tolerance; rows of
    equal lengths keep their order (a batch of equal rows stays one group, in order)."""
    rows = [r for r in range(len(spans.k_len)) if spans.q_len[r]]  # a row without queries computes nothing
    order = sorted(rows, key=lambda r: (-spans.k_len[r], -spans.q_len[r]))
    groups: list[list[int]] = []
    for r in order:
        if groups:
            head = groups[-1][0]
            close = spans.k_len[r] >= (1 - LENGTH_TOLERANCE) * spans.k_len[head]
            if close and spans.q_len[r] >= (1 - LENGTH_TOLERANCE) * spans.q_len[head]:
                groups[-1].append(r)
                continue
        groups.append([r])
    return groups


def _index(starts: list[int], lengths: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, widest] positions of each row's span, and which of them are real."""
    width = max(lengths)
    offsets = torch.arange(width, device=device)[None, :]
    base = torch.tensor(starts, device=device)[:, None] + offsets
    valid = offsets < torch.tensor(lengths, device=device)[:, None]
    return base, valid


def _in_order(starts: list[int], lengths: list[int], total: int) -> bool:
    """The spans tile [0, total) in order with one length: a view replaces the gather."""
    width = lengths[0]
    return (
        all(n == width for n in lengths)
        and starts == list(range(0, total, width))
        and width * len(starts) == total
    )


class RaggedAttention:
    """The attention plan of one forward: computed once from the row spans, used by every layer."""

    def __init__(self, spans: RowSpans, device: torch.device) -> None:
        self.spans = spans
        self.queries = spans.queries
        self.groups = [self._group(rows, device) for rows in _grouped_rows(spans)]

    def _group(self, rows: list[int], device) -> _Group:
        pick = lambda values: [values[r] for r in rows]  # noqa: E731
        q_start, q_len, k_start, k_len = (
            pick(v) for v in (self.spans.q_start, self.spans.q_len, self.spans.k_start, self.spans.k_len)
        )
        k_index, k_valid = _index(k_start, k_len, device)
        k_index = torch.where(k_valid, k_index, k_index[:, :1])
        shape = (len(rows), max(q_len))
        if _in_order(q_start, q_len, self.queries):
            return _Group(None, None, k_index, None if min(k_len) == max(k_len) else k_valid, shape)
        q_index, q_valid = _index(q_start, q_len, device)
        q_read = torch.where(q_valid, q_index, q_index[:, :1])
        q_write = torch.where(q_valid, q_index, torch.full_like(q_index, self.queries))
        return _Group(q_read, q_write, k_index, None if min(k_len) == max(k_len) else k_valid, shape)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Nq, H, hd], k/v [Nk, Hkv, hd] -> [Nq, H, hd]: every row over its own keys."""
        if not self.groups:
            return q.new_empty(q.shape)
        whole = self.groups[0]
        if whole.q_read is None:  # one group holding every query in order (rows of one length)
            return self._run(whole, q.view(*whole.shape, *q.shape[1:]), k, v).reshape(q.shape)
        out = q.new_empty(self.queries + 1, *q.shape[1:])
        for group in self.groups:
            out[group.q_write] = self._run(group, q[group.q_read], k, v)
        return out[: self.queries]

    @staticmethod
    def _run(group: _Group, queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One group's SDPA: queries [Rg, Tq, H, hd] -> outputs of the same shape."""
        keys, values = k[group.k_index].transpose(1, 2), v[group.k_index].transpose(1, 2)
        return attend(queries.transpose(1, 2), keys, values, group.k_valid).transpose(1, 2)
