"""The runner for a loaded model: the one cycle driver with the stepper of its family's cache kind (the
kind its record names: engine_pod/kinds/), led over its tensor-parallel group where it has one."""

from __future__ import annotations

from dllm_contracts.run_rules import sparse_family_problem
from engine_pod.decoding.config import DecodingConfig
from engine_pod.runner.contract import Runner
from engine_pod.runner.cycle_driver import CycleRunner
from engine_pod.runner.model_interface import ServedModel
from engine_pod.runner.tensor_parallel import lead


def make_runner(
    loaded: ServedModel,
    decoding: DecodingConfig,
    pool_tokens: int | None = None,
    record_trace: bool = False,
    record_margins: bool = False,
) -> Runner:
    """``pool_tokens`` sizes the KV pool (the token budget);
    ``record_trace`` (row 0's forwards and commits) and ``record_margins`` (each committed position's top-two
    gap) are recorded by a kind that records them and refused for the others. Rank 0 of a tensor-parallel
    group tells the other ranks to build theirs alike (runner/tensor_parallel.py)."""
    recipe = (decoding, pool_tokens, record_trace, record_margins)
    family = loaded.family
    kind = family.kind
    refuse_candidates(loaded, decoding)
    if decoding.sparse.on and (problem := sparse_family_problem(family.display_name, kind.name)):
        raise ValueError(problem)
    records = {"record_trace": record_trace, "record_margins": record_margins}
    if kind.records_margins:
        stepper = kind.stepper(loaded, decoding, pool_tokens, **records)
    else:
        for name, asked in records.items():
            if asked:
                raise ValueError(f"{name} is not supported for {family.display_name} ({kind.name} cache)")
        stepper = kind.stepper(loaded, decoding, pool_tokens)
    return lead(CycleRunner(loaded, decoding, stepper), loaded, recipe)


def refuse_candidates(loaded: ServedModel, decoding: DecodingConfig) -> None:
    """Logit candidates need the whole head on one process and a sampler that reads positions' logits
    one by one: DiffusionGemma's self-conditions on the whole vocabulary's softmax."""
    if not decoding.logit_candidates:
        return
    if loaded.family.kind.canvas_rows:  # its canvases self-condition on the softmax
        raise ValueError(
            f"--logit-candidates: {loaded.family.display_name} conditions each step on the whole "
            "vocabulary's softmax; use 0"
        )
    if loaded.parallel.size > 1:
        raise ValueError(
            "--logit-candidates needs the whole LM head in one process: use --tensor-parallel 1 and "
            "--expert-parallel 1"
        )
