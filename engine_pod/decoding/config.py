"""Decoding options shared by every scheduler: block length, steps, remasking policy, cache, masked suffix."""

from __future__ import annotations

from dataclasses import dataclass, field

from dllm_contracts.head_sparse_config import HeadSparseConfig
from dllm_contracts.logit_settings import logit_problems
from dllm_contracts.request_params import REQUEST_SETTINGS
from engine_pod.models.logit_budget import LogitBudget

REMASKING = ("low_confidence", "threshold", "scheduled_threshold", "entropy", "maskgit_plus", "topk_margin")
CACHE_MODES = ("none", "prefix", "dual")


class DecodingConfigError(ValueError):
    """Decoding options that cannot work together."""


@dataclass(frozen=True)
class DecodingConfig:
    """How every block is denoised. One config is shared by all rows of a batch."""

    block_length: int = 32  # L: tokens per block
    steps_per_block: int = 32  # S: denoising steps per block (a cap for threshold decoding)
    remasking: str = "threshold"  # which positions to commit at each step (see decoding/policies)
    threshold: float = 0.9  # confidence needed by the threshold policy
    cache: str = "dual"  # none: full forwards; prefix: cache before the block; dual: cache outside it
    # every row also holds its masked suffix up to its generation budget, as LLaDA's and Fast-dLLM's reference
    # code (``--canvas full``); False: the prompt and the blocks so far (BlockServe, ``--canvas block``)
    masked_suffix: bool = False
    ignore_eos: bool = False  # keep generating after a block that contains EOS
    eps: float = 1e-3  # Dream's final timestep, used by the timestep schedule of quota policies
    # block-diffusion models (LLaDA2.0, SDAR): share the keys and values of whole blocks between requests
    # with the same leading tokens and keep a finished request's blocks (docs/design.md); exact, so on by
    # default. LLaDA and Dream attend both ways: nothing is shared whatever this says.
    prefix_cache: bool = True
    # the most positions whose full-vocabulary logits exist at once: the LM head runs over the selected
    # positions in chunks of this many (None: automatic, about 2**24 vocabulary entries per chunk, 16 to
    # 1024 positions: 132 for a 126,464-token vocabulary). Outputs are the same bits for every value.
    max_materialized_logits: int | None = None
    # k > 0: each position's k likeliest tokens under the LM head in bfloat16 are its candidates, and only
    # their exact logits are computed; proposals, confidences (a softmax over the k), draws and log
    # probabilities are over them (models/logit_head.py). 0: the whole vocabulary. Changes outputs.
    logit_candidates: int = 0
    # every product row-invariant (models/batch_invariant.py): a request's float32 outputs are the same
    # bits alone and in any batch whatever kernels the matrix library picks; on a GPU, no TF32 and no
    # reduced-precision reductions. Off by default: it costs time (docs/design.md)
    batch_invariant: bool = False
    # LLaDA and Dream: each attention head keeps part of the dual cache (dllm_contracts/head_sparse_config.py); off by default
    sparse: HeadSparseConfig = field(default_factory=HeadSparseConfig)

    def __post_init__(self) -> None:
        if self.block_length < 1:
            raise DecodingConfigError(f"block length must be positive, got {self.block_length}")
        if self.steps_per_block < 1:
            raise DecodingConfigError(f"steps per block must be positive, got {self.steps_per_block}")
        if self.remasking not in REMASKING:
            raise DecodingConfigError(f"unknown remasking {self.remasking!r}; choose one of {REMASKING}")
        if self.cache not in CACHE_MODES:
            raise DecodingConfigError(f"unknown cache mode {self.cache!r}; choose one of {CACHE_MODES}")
        for name, message in logit_problems(self.max_materialized_logits, self.logit_candidates).items():
            raise DecodingConfigError(f"{name.replace('_', ' ')} {message}")
        if not REQUEST_SETTINGS["threshold"].in_range(self.threshold):  # a request's threshold replaces it
            raise DecodingConfigError(
                f"threshold must be {REQUEST_SETTINGS['threshold'].range_text()}, got {self.threshold}"
            )
        if self.sparse.on and self.cache != "dual":
            raise DecodingConfigError(
                f"the head-sparse cache is a dual cache; it needs cache 'dual', not {self.cache!r}"
            )

    @property
    def logit_budget(self) -> LogitBudget:
        return LogitBudget(self.max_materialized_logits, self.logit_candidates)

    @property
    def uses_cache(self) -> bool:
        return self.cache != "none"


def steps_per_block_for(gen_length: int, block_length: int, steps: int) -> int:
    """Split ``steps`` over the blocks of ``gen_length`` as LLaDA and Fast-dLLM do, validating it."""
    if gen_length < 1:
        raise DecodingConfigError(f"generation length must be positive, got {gen_length}")
    if block_length < 1 or gen_length % block_length:
        raise DecodingConfigError(
            f"block length {block_length} does not divide the generation length {gen_length}"
        )
    num_blocks = gen_length // block_length
    if steps < num_blocks or steps % num_blocks:
        raise DecodingConfigError(
            f"steps {steps} is not a positive multiple of the number of blocks {num_blocks}"
        )
    return steps // num_blocks
