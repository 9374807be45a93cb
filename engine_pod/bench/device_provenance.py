"""Which tensors a GPU run would keep on the host, tracked on any machine, so that the op census counts
host-to-device copies and device reads as a GPU makes them.

On a CPU every tensor is on the one device: ``.to(device)``, ``.cpu()`` and ``.tolist()`` cost nothing
and reach no dispatcher, and ``torch.arange(n)`` looks like ``torch.arange(n, device=device)``. On a GPU
the first of each pair is on the host. ``Provenance`` follows each tensor's side instead: a factory called
without a device (``torch.tensor(list)``, ``torch.arange(n)``, ...) and ``.cpu()`` make host tensors; an op
whose tensor inputs are all on the host makes host tensors; everything else (the model's weights, factories
given a device, ops over device tensors) is on the device. It counts, as a GPU would make them:

- host-to-device copies: ``torch.tensor(data, device=...)``, ``.to(device)`` (``.cuda()``) of a host tensor,
  ``copy_`` from a host tensor into a device one, and a host tensor of more than one element given to an
  op beside device tensors (on a GPU an error; counted as the copy it would need);
- device reads: ``.tolist()``, ``.numpy()``, ``.cpu()`` and scalar reads (``item``, ``bool``, ``int``,
  ``float``) of a device tensor, counted where they are called (inside a custom op's kernel as well, where
  no dispatcher sees them); the census counts the dispatcher's syncs, such as ``nonzero``, only for device
  tensors too.

``.cpu()`` of a device tensor and ``.to(device)`` of a host one return copies, as on a GPU, so that the
original keeps its side.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

FACTORIES = ("tensor", "as_tensor", "arange", "zeros", "ones", "full", "empty", "rand", "randn", "randint")
FACTORIES += ("randperm", "linspace", "eye")
_FROM_DATA = ("tensor", "as_tensor")  # made from host data: a copy when given a device
SCALAR_READS = ("item", "__bool__", "__int__", "__float__", "__index__")


class Provenance:
    """Tracks host tensors while installed; ``copied(kind)`` and ``read(kind)`` receive what it counts."""

    def __init__(self, copied: Callable[[str], None], read: Callable[[str], None]) -> None:
        self.copied, self.read = copied, read
        self._host: dict[int, weakref.ref] = {}  # id -> the host tensor (by identity: tensors' == is theirs)
        self._saved: list[tuple[object, str, object]] = []
        self.reading = False  # inside a counted scalar read (its dispatched _local_scalar_dense is the same)

    def is_host(self, tensor: torch.Tensor) -> bool:
        held = self._host.get(id(tensor))
        return held is not None and held() is tensor

    def mark_host(self, value: object) -> None:
        for tensor in _tensors(value):
            key = id(tensor)

            def forget(dead: weakref.ref, key: int = key) -> None:
                if self._host.get(key) is dead:
                    del self._host[key]

            self._host[key] = weakref.ref(tensor, forget)

    def after_op(self, name: str, inputs: list[torch.Tensor], outputs: object) -> None:
        """An aten op ran: outputs of host-only inputs stay on the host; a host tensor beside device ones
        is a copy (one per such input)."""
        if not inputs:
            return
        host = [t for t in inputs if self.is_host(t)]
        if len(host) == len(inputs):
            self.mark_host(outputs)
            return
        if name == "aten.copy_":
            return  # counted by copy_ itself (census)
        for tensor in host:
            if tensor.dim() > 0 and tensor.numel() > 1:
                self.copied(f"host tensor in {name}")

    # ---- the Python-level entry points a GPU pays at ---------------------------------------------------
    def install(self) -> None:
        for name in FACTORIES:
            self._patch(torch, name, self._factory(name, getattr(torch, name)))
        self._patch(torch, "from_numpy", self._host_result(torch.from_numpy))
        self._patch(torch.Tensor, "to", self._to(torch.Tensor.to))
        self._patch(torch.Tensor, "cuda", self._cuda(torch.Tensor.cuda))
        self._patch(torch.Tensor, "cpu", self._cpu(torch.Tensor.cpu))
        for name in ("tolist", "numpy"):
            self._patch(torch.Tensor, name, self._reader(name, getattr(torch.Tensor, name)))
        for name in SCALAR_READS:
            self._patch(torch.Tensor, name, self._scalar_reader(name, getattr(torch.Tensor, name)))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _patch(self, owner: object, name: str, replacement: object) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def _factory(self, name: str, original):
        def make(*args, **kwargs):
            result = original(*args, **kwargs)
            if kwargs.get("device") is None:
                self.mark_host(result)
            elif name in _FROM_DATA and not (isinstance(args[0], torch.Tensor) and not self.is_host(args[0])):
                self.copied(f"torch.{name}(..., device=)")
            return result

        return make

    def _host_result(self, original):
        def make(*args, **kwargs):
            result = original(*args, **kwargs)
            self.mark_host(result)
            return result

        return make

    def _to(self, original):
        def to(tensor, *args, **kwargs):
            target = _target_device(args, kwargs)
            result = original(tensor, *args, **kwargs)
            if target is None or not self.is_host(tensor):
                return result
            self.copied("Tensor.to(device)")
            result = result.clone() if result is tensor else result  # a copy on the device, as a GPU makes
            self._host.pop(id(result), None)
            return result

        return to

    def _cuda(self, original):
        def cuda(tensor, *args, **kwargs):
            if self.is_host(tensor):
                self.copied("Tensor.cuda")
            return original(tensor, *args, **kwargs)

        return cuda

    def _cpu(self, original):
        def cpu(tensor, *args, **kwargs):
            result = original(tensor, *args, **kwargs)
            if self.is_host(tensor):
                return result
            self.read("Tensor.cpu")
            result = result.clone() if result is tensor else result  # a host copy, as a GPU makes
            self.mark_host(result)
            return result

        return cpu

    def _reader(self, name: str, original):
        def read(tensor, *args, **kwargs):
            if not self.is_host(tensor):
                self.read(f"Tensor.{name}")
            return original(tensor, *args, **kwargs)

        return read

    def _scalar_reader(self, name: str, original):
        def read(tensor, *args, **kwargs):
            if self.is_host(tensor) or self.reading:
                return original(tensor, *args, **kwargs)
            self.read("Tensor.item")
            self.reading = True
            try:
                return original(tensor, *args, **kwargs)
            finally:
                self.reading = False

        return read


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _target_device(args: tuple, kwargs: dict) -> object:
    """The device ``Tensor.to`` was asked for (a device, its name, or another tensor's), or None."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for arg in args:
        if isinstance(arg, (torch.device, str)):
            return arg
        if isinstance(arg, torch.Tensor):
            return arg.device
    return None


def flat_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor among an op's arguments (lists of tensors included)."""
    return _tensors(list(args)) + _tensors(list(kwargs.values()))
