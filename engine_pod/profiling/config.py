"""What a profile measures: the model, the device and the settings of the engine it plans for."""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.scheduler_config import DEFAULT_LAYOUT


@dataclass(frozen=True)
class ProfileConfig:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    block_length: int | None = 32  # None: the model's (DiffusionGemma: its canvas; else 32)
    steps: int = 4  # denoising steps per profiled block cycle (peak is reached by the first cached step)
    memory_limit: int | None = None  # memory the engine may have; default: what the device has free
    utilization: float = 0.9  # share of it to plan for
    max_tokens: int = 16384  # largest batch (rows x width) on the grid
    seed: int = 0
    layout: str = DEFAULT_LAYOUT  # how the engine lays batches out (the budget counts that layout's tokens)
    canvas: bool = False  # rows of one canvas each over a kept context (DiffusionGemma): set by run_profile
    family: str | None = None  # the family the checkpoint must be (None: any)
    tensor_parallel: int = 1  # ranks the model is split across: each rank's peak measured, the worst kept
    expert_parallel: int = 1  # sets of ranks a mixture of experts' experts are spread over
    max_materialized_logits: int | None = None  # the engine's logit budget (DecodingConfig), in force
    logit_candidates: int = 0  # and its candidates (0: the whole vocabulary)
    batch_invariant: bool = False  # the engine's products row-invariant (DecodingConfig.batch_invariant)
    sparse: HeadSparseConfig = HeadSparseConfig()  # the head-sparse cache the engine will run (off: dense)
