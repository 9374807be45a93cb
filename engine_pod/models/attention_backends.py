"""The engine's one attention call per layer: ``ragged_attention(q, k, v, plan)``, a registered op.

Every packed forward (LLaDA and Dream's rows, block diffusion's rows over the paged pool) attends through
this op once per layer, whatever its rows' lengths; the plan (models/ragged.py) is built once per
forward from host ints. Two kernels behind it:

- a GPU with a half-precision model: one ``torch.nn.attention.varlen.varlen_attn`` call (a flash kernel
  over cumulative sequence offsets, with per-sequence key counts; one kernel whatever the lengths, no
  per-shape graph). A block-causal row whose queries span several blocks is cut into one sequence per
  block, each over the keys up to its block's end; causal rows (DiffusionGemma's encoder) use the
  kernel's window, aligned to the row's last key.
- everywhere else (CPU, float32 and float64): the plan's grouped SDPA, bit for bit what the engine's
  reference vectors and batch-invariance tests check.
"""

from __future__ import annotations

import torch

from engine_pod.host_bundle import to_device
from engine_pod.models.attention_rules import Masking
from engine_pod.models.ragged import RaggedAttention, VarlenBatch, plan_of

VARLEN_DTYPES = (torch.float16, torch.bfloat16)


def cpu_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: int) -> torch.Tensor:
    """The op's kernel on a CPU (and the op census's, run under its count): the plan's grouped SDPA."""
    return plan_of(plan).reference(q, k, v)


def _cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: int) -> torch.Tensor:
    layout = plan_of(plan)
    if q.dtype not in VARLEN_DTYPES or not varlen_available():
        return layout.reference(q, k, v)
    return varlen(layout, q, k, v)


# registered with the dispatcher's own API: a call costs a few microseconds (torch.library.custom_op's
# wrappers cost ~160 us a call and ~1.7 s and 70 MiB of imports at the first)
_LIBRARY = torch.library.Library("dllm", "DEF")
_LIBRARY.define("ragged_attention(Tensor q, Tensor k, Tensor v, int plan) -> Tensor")
_LIBRARY.impl("ragged_attention", cpu_kernel, "CPU")
_LIBRARY.impl("ragged_attention", _cuda, "CUDA")
_OP = torch.ops.dllm.ragged_attention.default


def ragged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: RaggedAttention
) -> torch.Tensor:
    """q [Nq, H, hd], k/v [Nk, Hkv, hd] -> [Nq, H, hd]: every row of ``plan`` over its own keys (inference:
    the op has no autograd formula)."""
    return _OP(q, k, v, plan.handle)


def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def varlen_sequences(plan: RaggedAttention) -> tuple[list[int], list[int], list[int], list[int]]:
    """The varlen kernel's sequences, in query order: (query start, query count, key start, key count).
    A block-causal row's queries are cut at its block boundaries, each piece over the keys up to its
    block's end."""
    spans, L = plan.spans, plan.masking.block
    sequences = []
    for r in sorted(range(len(spans.q_len)), key=spans.q_start.__getitem__):
        q_start, q_len, k_start, k_len = spans.q_start[r], spans.q_len[r], spans.k_start[r], spans.k_len[r]
        if not q_len:
            continue
        if not L or q_len <= L:
            sequences.append((q_start, q_len, k_start, k_len))
            continue
        first = k_len - q_len  # the row's first query position
        position = first
        while position < k_len:
            end = min((position // L + 1) * L, k_len)
            sequences.append((q_start + position - first, end - position, k_start, end))
            position = end
    return tuple(list(column) for column in zip(*sequences)) if sequences else ([], [], [], [])


def varlen(plan: RaggedAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One varlen flash call over the plan's sequences (metadata: derived on the device by the plan's builder,
    else one host-to-device copy per plan)."""
    from torch.nn.attention.varlen import varlen_attn

    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    batch = varlen_batch(plan, k.shape[0], q.device)
    if batch is None:
        return out if not plan.queries else plan.reference(q, k, v)
    first, last, meta = batch.first, batch.last, batch.metadata
    out[first:last] = varlen_attn(
        q[first:last],
        k,
        v,
        meta[0],
        meta[1],
        batch.max_q,
        batch.max_k,
        scale=plan.style.scale,
        window_size=_window(plan.masking),
        enable_gqa=q.shape[1] != k.shape[1],
        seqused_k=meta[2][:-1],
    )
    return out


def varlen_batch(plan: RaggedAttention, keys: int, device: torch.device) -> VarlenBatch | None:
    """The plan's varlen batch: its builder's, or made from its spans at the forward's first layer and
    reused by the others (the op census calls it too: what the GPU path copies, counted on any machine)."""
    if not plan.varlen_made:
        plan.settle_varlen(_varlen_batch(plan, keys, device))
    return plan.varlen


def _varlen_batch(plan: RaggedAttention, keys: int, device: torch.device) -> VarlenBatch | None:
    """The plan's sequences' varlen batch, its metadata copied from the host; None where there are none, or
    where rows leave gaps between their queries (not one varlen batch: the reference runs instead)."""
    host = varlen_rows(plan, keys)
    if host is None:
        return None
    first, last, max_q, max_k, rows = host
    metadata = to_device(torch.tensor(rows, dtype=torch.int32), device)  # not blocking the host
    return VarlenBatch(first, last, max_q, max_k, metadata)


def varlen_rows(plan: RaggedAttention, keys: int) -> tuple[int, int, int, int, list[list[int]]] | None:
    """(first query, last query, longest query run, longest key run, the metadata's three rows) on the host,
    for a builder that sends them with its own copy; None where there is no varlen batch."""
    q_start, q_len, k_start, k_len = varlen_sequences(plan)
    if not q_len or any(q_start[i] + q_len[i] != q_start[i + 1] for i in range(len(q_len) - 1)):
        return None
    first, last = q_start[0], q_start[-1] + q_len[-1]
    rows = [[s - first for s in q_start] + [last - first], k_start + [keys], k_len + [0]]
    return first, last, max(q_len), max(k_len), rows


def _window(masking: Masking) -> tuple[int, int]:
    """varlen's (left, right) window: the whole row, or causal (aligned to the last key: a row's queries
    are its last keys), within the sliding window where there is one."""
    if not masking.causal:
        return (-1, -1)
    return (-1 if masking.window is None else masking.window - 1, 0)
