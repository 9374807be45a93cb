"""Whether a process's (or a group's) weights fit, judged before any is allocated, in one line naming the
sizes: a model that cannot fit would otherwise be killed for memory much later, after minutes of loading.

On a GPU each rank has a device of its own, so each rank's share is judged against its device. On a CPU
the ranks on one machine share its memory: their shares together are judged against the machine, and each
rank's share against the address space one process may use (``ulimit -v``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from dllm_contracts.model_source import ModelLoadError
from engine_pod.families.registry import family_of
from engine_pod.loading.loaded import no_initial_draws


def parameter_count(config: Any) -> int:
    """The model's parameters, counted on a meta model without drawing any weights: by the family's own
    count where it has one, else on a model of its distinct layers (every layer after the first dense ones
    is alike), in milliseconds where building all of a large MoE's experts takes seconds."""
    family = family_of(config)
    if family.count_parameters is not None:
        with no_initial_draws():
            return family.count_parameters(config)
    distinct = min(config.num_layers, (config.moe.first_dense_layers if config.moe else 0) + 1)
    with torch.device("meta"), no_initial_draws():
        model = family.architecture(replace(config, num_layers=distinct))
    last = sum(p.numel() for p in model.layers[-1].parameters())
    tied = (
        config.vocab_size * config.hidden_size if config.tied_embeddings else 0
    )  # one tensor, counted twice
    return sum(p.numel() for p in model.parameters()) + (config.num_layers - distinct) * last - tied


def check_weights_fit(
    config: Any,
    device: torch.device,
    dtype: torch.dtype,
    parameters: int | None = None,
    ranks_here: int = 1,
) -> None:
    """Refuse, in one line naming the sizes, weights larger than the memory the device has for them;
    ``parameters``: those one process holds (a rank's), else the whole model's; ``ranks_here``: the group's
    ranks on this machine, each holding as many (on a CPU they share its memory; a GPU rank has its own)."""
    from engine_pod.device_memory import address_space_left, available_memory

    needed = (parameter_count(config) if parameters is None else parameters) * dtype.itemsize
    name = str(dtype).removeprefix("torch.")
    if device.type != "cuda" and ranks_here > 1:
        together, available = needed * ranks_here, available_memory(device)
        if together > available:
            raise ModelLoadError(
                f"the model's weights need {_gib(needed)} in {name} on each of the {ranks_here} ranks on this "
                f"machine, {_gib(together)} together, more than the {_gib(available)} of memory on {device}: "
                "ranks on one machine share its memory; choose a smaller model or a lower-precision --dtype, "
                "or spread the group over machines (--nodes)"
            )
    else:
        available = available_memory(device)
        if needed > available:
            advice = (
                "a larger device or more --tensor-parallel ranks"
                if device.type == "cuda"
                else "a machine with more memory (ranks on one machine share its memory: more of them do "
                "not help)"
            )
            raise ModelLoadError(
                f"the model's weights need {_gib(needed)} in {name}, more than the {_gib(available)} of "
                f"memory on {device}; choose a smaller model, a lower-precision --dtype or {advice}"
            )
    room = address_space_left() if device.type != "cuda" else None
    if room is not None and needed > room:
        raise ModelLoadError(
            f"the model's weights need {_gib(needed)} in {name} in each process, more than the "
            f"{_gib(room)} of address space a process may still use here (ulimit -v): raise the limit, or "
            "choose a smaller model or a lower-precision --dtype"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"
