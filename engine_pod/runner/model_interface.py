"""What the engine needs of a model, declared rather than found by convention.

``ServedModel`` is a loaded model as a runner sees it (loading/loader.py's ``LoadedModel`` is one);
``EngineModel`` is what the cycle driver needs of every family's model; ``TokenModel`` is what the
steppers of the bidirectional and block-causal kinds need (one forward over a ``ForwardBatch``, the LM
head on the positions it selects, a KV pool of the model's layers). A kind whose stepper needs more
declares its own (kinds/canvas/model_interface.py). Each kind names its interface
(``CacheKind.model_interface``, runner/kind.py) and ``conformance_problems`` holds a model to it: a test
runs it on every registered family's model.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # tensors: named here, never imported at run time
    import torch

    from engine_pod.decoding.config import LogitBudget
    from engine_pod.models.forward_batch import ForwardBatch
    from engine_pod.models.paged_kv import PagedKVPool
    from engine_pod.models.transformer import SelectedHidden
    from engine_pod.parallel.group import TensorParallel


class EngineModel(Protocol):
    """What the cycle driver needs of every family's model."""

    config: Any  # its family's config
    # how its LM head materializes logits (models/logit_budget.py): the cycle driver sets its runner's
    # before each cycle (several runners may share one model)
    logit_budget: LogitBudget


class TokenModel(EngineModel, Protocol):
    """A model whose forward takes one forward batch: the bidirectional and block-causal kinds'."""

    def forward_batch(self, batch: ForwardBatch, select: tuple[torch.Tensor, torch.Tensor]) -> SelectedHidden:
        """The final hidden states of the positions ``select`` names (rows, columns), ready for the LM
        head, after every layer attended through ``batch``."""
        ...

    def new_pool(self, num_pages: int, page_size: int, device: torch.device) -> PagedKVPool:
        """A KV pool of ``num_pages`` pages of ``page_size`` positions for this model's layers and heads."""
        ...

    def fuse_projections(self) -> None:
        """Inference only: each attention's q, k and v projections as one matmul (after the weights)."""
        ...


class DualCacheModel(TokenModel, Protocol):
    """A token model whose dual cache's refresh can be split across cycles: the bidirectional kind's."""

    def forward_layers(
        self, batch: ForwardBatch, hidden: torch.Tensor | None, start: int, end: int, last: torch.Tensor
    ) -> torch.Tensor:
        """Layers ``[start, end)`` of ``batch``'s forward from ``hidden`` (None: the tokens' embedding), each
        writing its keys and values where the batch says (kinds/bidirectional/split_refresh.py); the states
        leaving layer ``end - 1``."""
        ...


class ServedModel(Protocol):
    """A loaded model as a runner sees it."""

    model: Any  # its family's architecture, an ``EngineModel`` of its kind's interface
    config: Any  # its family's config (eos_token_ids, mask_token_id, ...)
    tokenizer: Any  # None where the model directory has none
    source: str
    device: torch.device
    dtype: torch.dtype
    parallel: TensorParallel  # its rank's place in a tensor-parallel group (one: the whole model)

    @property
    def family(self) -> Any:
        """Its family's record (families/record.py's ``ModelFamily``)."""
        ...


def conformance_problems(model: object, interface: type) -> list[str]:
    """Where ``model`` falls short of the Protocol ``interface``: each member it lacks, each method that is
    not callable or whose parameters are not the interface's (by name, in order). Empty: it conforms."""
    problems = []
    for cls in reversed(interface.__mro__):
        if cls is object or cls is Protocol or not getattr(cls, "_is_protocol", False):
            continue
        for name in getattr(cls, "__annotations__", {}):
            if not hasattr(model, name):
                problems.append(f"lacks attribute {name!r} ({cls.__name__})")
        for name, declared in vars(cls).items():
            if name.startswith("_") or not inspect.isfunction(declared):
                continue
            problems += _method_problems(model, name, declared, cls.__name__)
    return problems


def _method_problems(model: object, name: str, declared, owner: str) -> list[str]:
    found = getattr(model, name, None)
    if found is None:
        return [f"lacks method {name!r} ({owner})"]
    if not callable(found):
        return [f"{name!r} is not callable ({owner})"]
    wanted = [p for p in inspect.signature(declared).parameters if p != "self"]
    has = inspect.signature(found).parameters
    extra = list(has)[len(wanted) :]
    if list(has)[: len(wanted)] != wanted or any(has[p].default is inspect.Parameter.empty for p in extra):
        return [f"{name}{tuple(has)} does not take {tuple(wanted)} ({owner})"]
    return []
