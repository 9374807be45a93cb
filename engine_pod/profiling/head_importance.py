"""Head importance (``dllm heads``): how much the masked-diffusion loss depends on each attention head.

Score of head h in a layer: the L2 norm of the loss's gradient with respect to the head's columns of the
layer's output projection (``o_proj``), the gradient summed over a seeded calibration set of the
synthetic tasks' training split (masked as in training, synthetic/masked_batches.py); then divided by the
layer's sum, so that each layer's heads share 1. ``o_proj``'s columns of a head are the only weights
that carry that head alone (a K/V head of a grouped-query model serves several query heads), and the
gradient there is the head's output weighted by the loss's sensitivity to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from itertools import islice

import torch
import torch.nn.functional as F
from tqdm import tqdm

from dllm_contracts.run_rules import sparse_family_problem
from engine_pod.loading.loader import LoadedModel
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.synthetic.masked_batches import TrainingBatch, encode, make_batches
from engine_pod.synthetic.tasks import generate_examples

SCORE = "l2 norm of the masked-diffusion loss gradient w.r.t. the head's o_proj columns, shares of the layer"


@dataclass(frozen=True)
class ImportanceConfig:
    examples: int = 256  # calibration examples (training split)
    seed: int = 0
    token_budget: int = 4096  # tokens per forward (padding included)
    tasks: tuple[str, ...] | None = None  # None: every default task

    def __post_init__(self) -> None:
        if self.examples < 1:
            raise ValueError(f"calibration examples must be positive, got {self.examples}")
        if self.token_budget < 1:
            raise ValueError(f"token budget must be positive, got {self.token_budget}")


def _batches(loaded: LoadedModel, cfg: ImportanceConfig, block_length: int) -> list[TrainingBatch]:
    if loaded.tokenizer is None:
        raise ValueError("head importance needs the model's tokenizer (the model directory has none)")
    stream = generate_examples(cfg.seed, "train", tasks=cfg.tasks)
    encoded = [encode(loaded.tokenizer, e) for e in islice(stream, cfg.examples)]
    eos = loaded.config.eos_token_ids[0]
    rng = random.Random(f"{cfg.seed}-heads")
    return make_batches(encoded, rng, block_length, eos, loaded.config.mask_token_id, cfg.token_budget)


def _loss(loaded: LoadedModel, batch: TrainingBatch) -> torch.Tensor:
    """training/train.py's loss, with the family's logit shift (Dream predicts p from p - 1)."""
    shift = loaded.family.quirks.logit_shift
    rows, cols = (batch.loss_weight > 0).nonzero(as_tuple=True)
    forward = ForwardBatch.box_over_itself(batch.input_ids, batch.position_ids, batch.key_mask)
    selected = loaded.model.forward_batch(forward, (rows, (cols - shift).clamp(min=0)))
    ce = F.cross_entropy(selected.logits().float(), batch.targets[rows, cols], reduction="none")
    return (ce * batch.loss_weight[rows, cols]).sum() / batch.normaliser


def head_importance(loaded: LoadedModel, cfg: ImportanceConfig, block_length: int = 32) -> dict:
    """The importance report: per layer, per (query) head, normalised scores and raw gradient norms."""
    problem = sparse_family_problem(loaded.family.display_name, loaded.family.kind.name)
    if problem is not None:  # the scores serve the head-sparse cache alone
        raise ValueError(problem)
    torch.manual_seed(cfg.seed)
    model, config = loaded.model, loaded.config
    projections = [layer.attn.o_proj.weight for layer in model.layers]
    was = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    for p in projections:
        p.requires_grad_(True)
        p.grad = None
    batches = _batches(loaded, cfg, block_length)
    try:
        with torch.enable_grad():
            for batch in tqdm(batches, desc="head importance", unit="batch"):
                moved = replace(batch, **{k: getattr(batch, k).to(loaded.device) for k in _TENSORS})
                (_loss(loaded, moved) / len(batches)).backward()
        norms = [
            p.grad.float().view(p.shape[0], config.num_heads, config.head_dim).norm(dim=(0, 2)).tolist()
            for p in projections
        ]
    finally:
        for p, flag in zip(model.parameters(), was):
            p.requires_grad_(flag)
            p.grad = None
    shares = [[n / max(sum(layer), 1e-30) for n in layer] for layer in norms]
    return {
        "model": loaded.source,
        "family": loaded.family.name,
        "score": SCORE,
        "seed": cfg.seed,
        "examples": cfg.examples,
        "layers": config.num_layers,
        "heads": config.num_heads,
        "importance": [[round(s, 6) for s in layer] for layer in shares],
        "gradient_norms": [[round(n, 8) for n in layer] for layer in norms],
    }


_TENSORS = ("input_ids", "position_ids", "key_mask", "targets", "loss_weight")
