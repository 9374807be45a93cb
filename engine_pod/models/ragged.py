"""Variable-length attention for packed batches: each row's queries attend over that row's keys only.

Queries and keys of all rows are concatenated (no padding): query row r is ``q[q_start[r]:][:q_len[r]]``
and its keys ``k[k_start[r]:][:k_len[r]]``. A ``RaggedAttention`` plan is built once per forward from
the rows' lengths (host ints: nothing is read back from the device) and every layer attends through one
call of the registered op ``dllm::ragged_attention`` (models/attention_backends.py chooses the kernel:
one varlen flash kernel on a GPU, the grouped SDPA below elsewhere). What a row may see of its keys and
how SDPA is called are the plan's ``Masking`` and ``SdpaStyle`` (models/attention_rules.py).

The grouped SDPA, the reference: rows are grouped by length and each group runs as one SDPA call. The runner packs rows in length order (kinds/bidirectional/packing.py), so a group of one length is a
contiguous run: a view, nothing gathered, nothing padded. Groups may also admit rows within
``LENGTH_TOLERANCE`` of their widest (fewer calls, some padding, gathered); padding entries read a real
position and are masked out, their outputs discarded.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine_pod.models.attention_rules import BIDIRECTIONAL, DEFAULT_STYLE, Masking, SdpaStyle
from engine_pod.models.block_chunks import block_chunks
from engine_pod.models.sdpa import attend, expand_heads
from engine_pod.models.window_chunks import WindowChunk, sdpa_by_chunks, window_chunks

# a group's rows are at least (1 - this) x its widest row. Measured on the heterogeneous workload (same
# runs, this CPU): 6394 tokens/s with groups of one length (0) against 4293 with 0.1 (gathers, padding).
LENGTH_TOLERANCE = 0.0


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
class VarlenBatch:
    """A plan as the GPU's varlen kernel takes it: its queries ``[first, last)``, the longest query and key
    runs, and ``metadata`` [3, n + 1] int32 on the device (each sequence's query offset from ``first``,
    key start and keys used, the first two closed by the totals)."""

    first: int
    last: int
    max_q: int
    max_k: int
    metadata: torch.Tensor


def varlen_on_device(
    q_len: torch.Tensor, k_start: torch.Tensor, k_len: torch.Tensor, host: RowSpans, keys: int
) -> VarlenBatch | None:
    """The varlen batch of rows whose queries follow each other from 0 in the order given (``q_len``,
    ``k_start``, ``k_len`` [R] on the device, in that order; ``host`` the same spans on the host, in any
    order; ``keys`` the forward's keys): derived on the device from what it holds, no copy; None where
    there are no queries. The caller makes sure no row needs cutting (a block-causal row whose queries span
    several blocks: the host cuts those)."""
    if not host.queries:
        return None
    cu_q = F.pad(q_len.cumsum(0), (1, 0))
    metadata = torch.stack([cu_q, F.pad(k_start, (0, 1), value=keys), F.pad(k_len, (0, 1))])
    return VarlenBatch(0, host.queries, max(host.q_len), max(host.k_len), metadata.to(torch.int32))


@dataclass(frozen=True)
class Box:
    """A padded box: ``rows`` rows of ``q_width`` queries over ``k_width`` keys each, what each query may see
    given by ``mask`` [rows, 1 or q_width, k_width] (static batching's layout, padding included): one SDPA
    call under the mask, the grouped K/V heads repeated for every query head."""

    rows: int
    q_width: int
    k_width: int
    mask: torch.Tensor


@dataclass(frozen=True)
class _Group:
    """One SDPA call. A span that is ``(start, count)`` is a contiguous run of ``count`` rows of one
    length (read as a view, no gather); an index tensor is a gather (padding: any real position)."""

    queries: tuple[int, int] | torch.Tensor  # [Rg, Tq] where not contiguous
    keys: tuple[int, int] | torch.Tensor  # [Rg, Tk] where not contiguous
    k_valid: torch.Tensor | None  # [Rg, Tk] False on padding keys; None where no row is padded
    q_write: torch.Tensor | None  # [Rg, Tq] where outputs go when the queries are gathered
    shape: tuple[int, int, int]  # (Rg, Tq, Tk)
    mask: torch.Tensor | None = None  # [Tq, Tk] shared by the group's rows (Masking.group_mask)
    causal: bool = False  # SDPA's is_causal stands for the mask
    # a long sliding-window or block-causal group's SDPA calls (models/window_chunks.py, block_chunks.py)
    chunks: tuple[WindowChunk, ...] = ()


def _grouped_rows(spans: RowSpans, exact: bool) -> list[list[int]]:
    """Rows sorted by key length (then query length) and cut into groups within the tolerance (of one
    length each where ``exact``); rows of equal lengths keep their order (a batch of equal rows stays
    one group, in order)."""
    tolerance = 0.0 if exact else LENGTH_TOLERANCE
    rows = [r for r in range(len(spans.k_len)) if spans.q_len[r]]  # a row without queries computes nothing
    order = sorted(rows, key=lambda r: (-spans.k_len[r], -spans.q_len[r]))
    groups: list[list[int]] = []
    for r in order:
        if groups:
            head = groups[-1][0]
            close = spans.k_len[r] >= (1 - tolerance) * spans.k_len[head]
            if close and spans.q_len[r] >= (1 - tolerance) * spans.q_len[head]:
                groups[-1].append(r)
                continue
        groups.append([r])
    return groups


def _index(starts: list[int], lengths: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """[rows, widest] positions of each row's span (padding: the row's first), and which are real."""
    width = max(lengths)
    offsets = torch.arange(width, device=device)[None, :]
    base = torch.tensor(starts, device=device)[:, None] + offsets
    valid = offsets < torch.tensor(lengths, device=device)[:, None]
    return torch.where(valid, base, base[:, :1]), valid


def _contiguous(starts: list[int], lengths: list[int]) -> tuple[int, int] | None:
    """``(start, rows)`` when the spans are one length and follow each other in memory."""
    width = lengths[0]
    if any(n != width for n in lengths) or starts != list(
        range(starts[0], starts[0] + width * len(starts), width)
    ):
        return None
    return starts[0], len(starts)


class RaggedAttention:
    """The attention plan of one forward: computed once from the row spans, used by every layer through
    ``attention_backends.ragged_attention``. Rows that need a mask are grouped by exact lengths."""

    def __init__(
        self,
        spans: RowSpans,
        device: torch.device,
        masking: Masking = BIDIRECTIONAL,
        style: SdpaStyle = DEFAULT_STYLE,
        varlen: VarlenBatch | None = None,
    ) -> None:
        """``varlen``: the plan's varlen batch where its builder derived it on the device (else the GPU path
        makes it from the spans, one copy)."""
        self.spans = spans
        self.queries = spans.queries
        self.masking, self.style = masking, style
        self.device = device
        self.varlen: VarlenBatch | None = None
        self.varlen_made = False  # whether ``varlen`` is settled (None then: no varlen batch)
        if varlen is not None:
            self.settle_varlen(varlen)
        self.box: Box | None = None
        self.handle = register_plan(self)

    @classmethod
    def over_box(cls, box: Box, device: torch.device) -> RaggedAttention:
        """The plan of a padded box: row r's queries ``[r Q, (r + 1) Q)`` over its keys ``[r K, (r + 1) K)``
        under the box's mask (no varlen batch: a GPU runs the masked SDPA too)."""
        Q, K = box.q_width, box.k_width
        rows = range(box.rows)
        plan = cls(
            RowSpans([r * Q for r in rows], [Q] * box.rows, [r * K for r in rows], [K] * box.rows), device
        )
        plan.box = box
        plan.settle_varlen(None)
        return plan

    def settle_varlen(self, varlen: VarlenBatch | None) -> None:
        """The plan's varlen batch, from its builder or from its spans (None: it has none)."""
        self.varlen, self.varlen_made = varlen, True

    @functools.cached_property
    def groups(self) -> list[_Group]:
        """The reference kernel's SDPA groups, made at its first call (a GPU's varlen kernel needs none)."""
        exact = self.masking != BIDIRECTIONAL
        return [self._group(rows, self.device) for rows in _grouped_rows(self.spans, exact)]

    def _group(self, rows: list[int], device) -> _Group:
        pick = lambda values: [values[r] for r in rows]  # noqa: E731
        q_start, q_len, k_start, k_len = (
            pick(v) for v in (self.spans.q_start, self.spans.q_len, self.spans.k_start, self.spans.k_len)
        )
        shape = (len(rows), max(q_len), max(k_len))
        keys = _contiguous(k_start, k_len)
        k_valid = None
        if keys is None:
            keys, valid = _index(k_start, k_len, device)
            k_valid = None if min(k_len) == max(k_len) else valid
        chunks = window_chunks(self.masking, shape[1], shape[2], device) or block_chunks(
            self.masking, shape[1], shape[2], device
        )
        mask, causal = (None, False) if chunks else self.masking.group_mask(shape[1], shape[2], device)
        queries = _contiguous(q_start, q_len)
        if queries is not None:
            return _Group(queries, keys, k_valid, None, shape, mask, causal, chunks)
        q_read, q_valid = _index(q_start, q_len, device)
        q_write = torch.where(q_valid, q_read, torch.full_like(q_read, self.queries))
        return _Group(q_read, keys, k_valid, q_write, shape, mask, causal, chunks)

    def reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Nq, H, hd], k/v [Nk, Hkv, hd] -> [Nq, H, hd]: every row over its own keys, group by group."""
        if self.box is not None:
            return self._box(q, k, v, self.box)
        if len(self.groups) == 1 and self.groups[0].q_write is None:  # every query, in place
            return self._run(self.groups[0], q, k, v).reshape(q.shape)
        out = q.new_empty(self.queries + 1, *q.shape[1:])
        for group in self.groups:
            result = self._run(group, q, k, v)
            if group.q_write is None:
                start, rows = group.queries
                out[start : start + rows * group.shape[1]] = result.reshape(-1, *q.shape[1:])
            else:
                out[group.q_write] = result
        return out[: self.queries]

    @staticmethod
    def _box(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, box: Box) -> torch.Tensor:
        """The box's one SDPA call: [R Q, H, hd] over [R K, Hkv, hd] under its mask."""
        heads = q.shape[1]
        queries = q.view(box.rows, box.q_width, *q.shape[1:]).transpose(1, 2)
        keys, values = (t.view(box.rows, box.k_width, *t.shape[1:]).transpose(1, 2) for t in (k, v))
        out = F.scaled_dot_product_attention(
            queries, expand_heads(keys, heads), expand_heads(values, heads), attn_mask=box.mask[:, None]
        )
        return out.transpose(1, 2).reshape(q.shape[0], heads, -1)

    @staticmethod
    def _take(values: torch.Tensor, span: tuple[int, int] | torch.Tensor, width: int) -> torch.Tensor:
        """[Rg, T, heads, hd] of a group: a view of a contiguous run, else a gather."""
        if isinstance(span, torch.Tensor):
            return values[span]
        start, rows = span
        return values[start : start + rows * width].view(rows, width, *values.shape[1:])

    def _run(self, group: _Group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One group's SDPA: outputs [Rg, Tq, H, hd]."""
        _, q_width, k_width = group.shape
        queries = self._take(q, group.queries, q_width).transpose(1, 2)
        keys = self._take(k, group.keys, k_width).transpose(1, 2)
        values = self._take(v, group.keys, k_width).transpose(1, 2)
        if self.style == DEFAULT_STYLE and group.mask is None and not group.causal and not group.chunks:
            return attend(queries, keys, values, group.k_valid).transpose(1, 2)
        return self._sdpa(queries, keys, values, group).transpose(1, 2)

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: _Group) -> torch.Tensor:
        """One group's SDPA in the plan's style, under its mask or causal flag (no padded keys here), or its
        chunks' calls, each under its own mask."""
        heads, style = q.shape[1], self.style
        masked = group.mask is not None or bool(group.chunks)
        native_gqa = heads != k.shape[1] and (
            (style.native_gqa and not masked) or (self.masking.block > 0 and q.device.type == "cpu")
        )
        if not native_gqa:
            k, v = expand_heads(k, heads), expand_heads(v, heads)
        if style.head_major:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if group.chunks:
            return sdpa_by_chunks(q, k, v, group.chunks, style.scale, native_gqa)
        mask = None if group.mask is None else group.mask[None, None]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=style.scale, is_causal=group.causal, enable_gqa=native_gqa
        )


_PLANS: weakref.WeakValueDictionary[int, RaggedAttention] = weakref.WeakValueDictionary()
_handles = itertools.count()


def register_plan(plan: RaggedAttention) -> int:
    """A handle the attention op finds the plan by, for as long as the plan lives (and no longer)."""
    handle = next(_handles)
    _PLANS[handle] = plan
    return handle


def plan_of(handle: int) -> RaggedAttention:
    return _PLANS[handle]
