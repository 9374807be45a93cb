"""Op census: what a block cycle asks of the device, counted at torch's dispatcher on any machine.

A GPU pays per operation as well as per flop: each attention call launches kernels (and, on some
backends, builds a graph for every new shape), each device-to-host read stalls the stream, each copy
of host data is a transfer. Those costs hide on a CPU, but the operations that cause them do not: a
``TorchDispatchMode`` sees every aten op a forward issues, whatever the device. ``Census`` records them
per model forward (and the host work between forwards) while a runner executes cycles, and sorts them:

- attention calls: SDPA kernels and the engine's attention op, with the shapes a backend specialises on;
- syncs: ops over device tensors whose result the host must wait for (``_local_scalar_dense`` behind
  ``item``/``int``/``bool``, ``nonzero``, ``masked_select``, ``unique``, ``bincount``,
  ``repeat_interleave`` with a repeats tensor, indexing with a boolean mask) and reads of device tensors
  (``tolist``, ``numpy``, ``cpu``), which on a CPU reach no dispatcher and are counted where called;
- host-to-device copies, as a GPU makes them: which tensors a GPU run keeps on the host is tracked
  (``device_provenance.py``), so that a factory moved with ``.to(device)``, ``torch.tensor(data,
  device=...)`` and a ``copy_`` from the host each count once, and reading a host tensor costs nothing;
  the engine's attention op counts the metadata its GPU kernel copies (once per plan) and runs its CPU
  kernel under the count, so a read inside it is seen;
- MoE layers: the ops each mixture-of-experts call issues (a loop over the experts hit grows them).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine_pod.bench.device_provenance import Provenance, flat_tensors
from engine_pod.models import attention_backends
from engine_pod.models.ragged import plan_of

ATTENTION_OPS = frozenset(
    {
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._scaled_dot_product_attention_math",
        "aten._flash_attention_forward",
        "dllm.ragged_attention",
    }
)
SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.bincount",
    }
)
FORWARD_METHODS = (
    "forward_batch",
    "encode",
    "encode_chunks",
)
FORWARD_METHODS += ("denoise",)
ATTENTION_MODULES = frozenset({"Attention", "BlockAttention", "GemmaAttention"})
MOE_MODULES = frozenset({"MixtureOfExperts", "GemmaExperts"})


@dataclass
class Segment:
    """The ops of one model forward (``kind`` its method) or of the host work after it (``kind`` "host")."""

    kind: str
    ops: Counter = field(default_factory=Counter)
    syncs: Counter = field(default_factory=Counter)
    host_to_device: int = 0
    copies: Counter = field(default_factory=Counter)  # the host-to-device copies by kind
    attention_calls: int = 0
    attention_shapes: set = field(default_factory=set)
    layers: int = 0  # attention layers run (a forward's)

    @property
    def aten_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def sync_count(self) -> int:
        return sum(self.syncs.values())


def _op_name(func) -> str:
    return str(func.overloadpacket)


def _is_sync(name: str, func, args, kwargs) -> bool:
    if name in SYNC_OPS:
        return True
    if name == "aten.repeat_interleave":  # repeats as a tensor: their sum sizes the output
        return func._overloadname in ("Tensor", "self_Tensor") and kwargs.get("output_size") is None
    if name in ("aten.index", "aten.index_put", "aten.index_put_"):  # a boolean mask: nonzero inside
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
    return False


def _attention_shape(name: str, args) -> tuple:
    """What a backend specialises on: every input's shape for SDPA; for the engine's ragged op (one
    varlen kernel on a GPU, built per head layout and dtype, not per length), heads, widths and dtype,
    but for a padded box (one masked SDPA call on a GPU too) the box's rows and widths as well."""
    if name == "dllm.ragged_attention":
        q, k, box = args[0], args[1], plan_of(args[3]).box
        extent = () if box is None else (box.rows, box.q_width, box.k_width)
        return (name, *extent, q.shape[1:], k.shape[1:], q.dtype)
    tensors = [a for a in args if isinstance(a, torch.Tensor)][:3]
    return (name, *((tuple(t.shape), t.dtype) for t in tensors))


class Census(TorchDispatchMode):
    """Counts every aten op into the current segment; ``watch(model)`` makes forwards segments of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.segments: list[Segment] = [Segment("host")]
        self.moe_calls: list[int] = []  # aten ops of each MoE layer call
        self.provenance = Provenance(self.host_to_device, self.host_read)
        self._moe_depth = 0
        self._moe_ops = 0
        self._inside_op = 0  # inside the engine's attention op: its kernel's ops count, not as attention
        self._cpu_kernel = False  # running the op's CPU kernel: its copies are not a GPU's (reads are)
        self._restore: list[tuple[object, str, object]] = []

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _op_name(func)
        segment = self.current
        if not self._inside_op:  # the op's CPU kernel's own ops are not a GPU's (its varlen kernel is one)
            segment.ops[name] += 1
        if self._moe_depth:
            self._moe_ops += 1
        inputs = flat_tensors(args, kwargs)
        on_device = any(not self.provenance.is_host(t) for t in inputs)
        counted = name == "aten._local_scalar_dense" and self.provenance.reading  # by the read's own call
        if on_device and not counted and _is_sync(name, func, args, kwargs):
            segment.syncs[name] += 1
        if name == "aten.copy_":
            self._copy(args[0], args[1])
        if name in ATTENTION_OPS and not self._inside_op:
            segment.attention_calls += 1
            segment.attention_shapes.add(_attention_shape(name, args))
        if name == "dllm.ragged_attention":
            return self._ragged_attention(*args)
        result = func(*args, **kwargs)
        self.provenance.after_op(name, inputs, result)
        return result

    def _copy(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        """``copy_``: from the host into a device tensor is a copy; from the device into a host one a read."""
        host_to, host_from = self.provenance.is_host(destination), self.provenance.is_host(source)
        if host_from and not host_to:
            self.host_to_device("copy_ from the host")
        elif host_to and not host_from:
            self.host_read("copy_ to the host")

    def _ragged_attention(self, q, k, v, plan: int) -> torch.Tensor:
        """The op as a GPU runs it: its varlen kernel's metadata made (copied where not derived on the
        device), then the CPU kernel in its place, whose reads count (its ops, attention calls and copies,
        the grouped SDPA's own, do not)."""
        self._inside_op += 1
        try:
            with self:
                attention_backends.varlen_batch(plan_of(plan), k.shape[0], q.device)
                self._cpu_kernel = True
                return attention_backends.cpu_kernel(q, k, v, plan)
        finally:
            self._inside_op -= 1
            self._cpu_kernel = False

    def host_read(self, kind: str) -> None:
        self.current.syncs[kind] += 1

    def host_to_device(self, kind: str) -> None:
        if self._cpu_kernel:  # the grouped SDPA's gather indices: a GPU's half-precision kernel makes none
            return
        self.current.host_to_device += 1
        self.current.copies[kind] += 1

    # ---- instrumentation -------------------------------------------------------------------------
    def watch(self, model: torch.nn.Module) -> None:
        """Make each forward entry of ``model`` a segment, count attention layers and time MoE calls."""
        for method in FORWARD_METHODS:
            if hasattr(model, method):
                self._wrap(model, method, self._forward_wrapper(method))
        for module in model.modules():
            kind = type(module).__name__
            if kind in ATTENTION_MODULES:
                for method in ("forward", "encode", "decode"):
                    if hasattr(module, method):
                        self._wrap(module, method, self._layer_wrapper)
            if kind in MOE_MODULES:
                self._wrap(module, "forward", self._moe_wrapper)

    def _wrap(self, owner: object, method: str, make) -> None:
        original = getattr(owner, method)
        self._restore.append((owner, method, owner.__dict__.get(method)))
        setattr(owner, method, make(original))

    def _forward_wrapper(self, kind: str):
        def make(original):
            def run(*args, **kwargs):
                self.segments.append(Segment(kind))
                try:
                    return original(*args, **kwargs)
                finally:
                    self.segments.append(Segment("host"))

            return run

        return make

    def _layer_wrapper(self, original):
        def run(*args, **kwargs):
            self.current.layers += 1
            return original(*args, **kwargs)

        return run

    def _moe_wrapper(self, original):
        def run(*args, **kwargs):
            self._moe_depth += 1
            before = self._moe_ops
            try:
                return original(*args, **kwargs)
            finally:
                self._moe_depth -= 1
                self.moe_calls.append(self._moe_ops - before)

        return run

    def unwatch(self) -> None:
        for owner, method, previous in reversed(self._restore):
            if previous is None:
                delattr(owner, method)
            else:
                setattr(owner, method, previous)
        self._restore.clear()


@contextlib.contextmanager
def counting(model: torch.nn.Module):
    """A census of everything run inside the block (reads of device tensors and copies from the host
    included, as a GPU makes them)."""
    census = Census()
    census.watch(model)
    census.provenance.install()
    try:
        with census:
            yield census
    finally:
        census.provenance.uninstall()
        census.unwatch()
