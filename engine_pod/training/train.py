"""Train the shipped LLaDA-architecture model on the synthetic tasks (masked-diffusion SFT).

Reproducible from a seed (each step's data comes from its own seeded stream), resumable from the
last saved state, with a progress bar and a loss curve. The result is written as a checkpoint in
the real LLaDA format (config.json + model.safetensors + tokenizer), loadable by every command.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine_pod.loading.config_readers import config_from_dict
from engine_pod.loading.loader import build_model
from engine_pod.loading.weights import save_checkpoint
from engine_pod.models.forward_batch import ForwardBatch
from engine_pod.models.transformer import DiffusionTransformer
from engine_pod.synthetic.masked_batches import TrainingBatch, encode, make_batches
from engine_pod.synthetic.tasks import generate_examples
from engine_pod.synthetic.vocabulary import LETTERS, NUMBERS
from engine_pod.training.plots import plot_loss
from engine_pod.training.tokenizer_build import build_tokenizer, save_tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    out_dir: str
    steps: int = 5000
    seed: int = 0
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 6
    mlp_hidden: int = 576
    vocab_size: int = 320
    block_length: int = 32
    examples_per_step: int = 64
    token_budget: int = 4096  # tokens per optimiser micro-batch
    lr: float = 2e-3
    warmup: int = 300
    curriculum_fraction: float = 0.3  # answers grow from 8 tokens to 128 over this share of steps
    save_every: int = 250
    max_minutes: float | None = None
    threads: int = 2
    tasks: tuple[str, ...] | None = None  # None: every task of TASKS


def llada_config_json(cfg: TrainConfig, tokenizer) -> dict:
    """A config.json with the real LLaDA field names and this model's sizes."""
    return {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "block_type": "llama",
        "d_model": cfg.d_model,
        "n_layers": cfg.n_layers,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_heads,
        "mlp_hidden_size": cfg.mlp_hidden,
        "mlp_ratio": cfg.mlp_hidden // cfg.d_model,
        "embedding_size": cfg.vocab_size,
        "vocab_size": cfg.vocab_size,
        "include_bias": False,
        "include_qkv_bias": False,
        "layer_norm_type": "rms",
        "rms_norm_eps": 1e-05,
        "rope": True,
        "rope_theta": 10000.0,
        "weight_tying": False,
        "max_sequence_length": 2048,
        "mask_token_id": tokenizer.mask_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "torch_dtype": "float32",
    }


def _init_weights(model: DiffusionTransformer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                std = 0.02 if "embed" in name or "lm_head" in name else 1 / math.sqrt(param.shape[1]) * 0.5
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def _value_code(values: torch.Tensor, dims: int, period: float) -> torch.Tensor:
    """Sinusoids of several periods: a value's neighbours are near it, and +1 is a fixed rotation."""
    pairs = dims // 2
    periods = period * torch.logspace(0, -1.5, pairs, base=10)
    angles = 2 * torch.pi * values[:, None] / periods[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1) * 0.02


def ordered_embeddings(model: DiffusionTransformer, tokenizer) -> None:
    """Initialise number and letter embeddings from their value (an initialisation, not an extra input).

    The successor of a token is then a rotation, which a small model finds quickly; the rest of each
    embedding stays random so that tokens remain distinguishable.
    """
    dims = model.config.hidden_size // 4
    with torch.no_grad():
        for group, period in ((NUMBERS, 2.0 * len(NUMBERS)), (LETTERS, 2.0 * len(LETTERS))):
            ids = torch.tensor(tokenizer.convert_tokens_to_ids(group))
            code = _value_code(torch.arange(len(group), dtype=torch.float32), dims, period)
            model.embed_tokens.weight[ids, :dims] = code


def loss_of(model: DiffusionTransformer, batch: TrainingBatch) -> torch.Tensor:
    rows, cols = (batch.loss_weight > 0).nonzero(as_tuple=True)
    forward = ForwardBatch.box_over_itself(batch.input_ids, batch.position_ids, batch.key_mask)
    selected = model.forward_batch(forward, (rows, cols))
    ce = F.cross_entropy(selected.logits(), batch.targets[rows, cols], reduction="none")
    return (ce * batch.loss_weight[rows, cols]).sum() / batch.normaliser


def _learning_rate(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _max_answer(cfg: TrainConfig, step: int) -> int:
    grown = step / max(1, cfg.curriculum_fraction * cfg.steps)
    return int(8 + (128 - 8) * min(1.0, grown))


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(cfg.threads)
        self.tokenizer = build_tokenizer(cfg.vocab_size)
        self.model_config = llada_config_json(cfg, self.tokenizer)
        self.model = build_model(config_from_dict(self.model_config), torch.device("cpu"), torch.float32)
        _init_weights(self.model, cfg.seed)
        ordered_embeddings(self.model, self.tokenizer)
        with torch.no_grad():  # tied at the start, untied after: copying a prompt token is easy from step one
            self.model.lm_head.weight.copy_(self.model.embed_tokens.weight)
        self.model.train()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.01
        )
        self.step = 0
        self.history: list[tuple[int, float]] = []

    @property
    def state_path(self) -> Path:
        return self.out / "train_state.pt"

    def resume(self) -> bool:
        if not self.state_path.is_file():
            return False
        state = torch.load(self.state_path, weights_only=False)
        if state["config"] != asdict(self.cfg) | {"out_dir": state["config"]["out_dir"]}:
            logger.warning("resuming with a different training config than the saved state")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = state["step"], state["history"]
        logger.info("resumed from step %d", self.step)
        return True

    def save_state(self) -> None:
        state = {
            "config": asdict(self.cfg),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step,
            "history": self.history,
        }
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.state_path)

    def _step_batches(self) -> list[TrainingBatch]:
        rng = random.Random(f"{self.cfg.seed}-step-{self.step}")
        stream = generate_examples(
            rng.randrange(2**31),
            "train",
            max_answer=_max_answer(self.cfg, self.step),
            tasks=self.cfg.tasks,
        )
        encoded = [encode(self.tokenizer, e) for e in islice(stream, self.cfg.examples_per_step)]
        mask, eos = self.tokenizer.mask_token_id, self.tokenizer.eos_token_id
        return make_batches(encoded, rng, self.cfg.block_length, eos, mask, self.cfg.token_budget)

    def train_step(self) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = _learning_rate(self.cfg, self.step)
        batches = self._step_batches()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch in batches:
            loss = loss_of(self.model, batch) / len(batches)
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        self.history.append((self.step, total))
        return total

    def run(self) -> Path:
        deadline = time.monotonic() + 60 * self.cfg.max_minutes if self.cfg.max_minutes else None
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="train", unit="step")
        while self.step < self.cfg.steps:
            loss = self.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", answer=_max_answer(self.cfg, self.step))
            if self.step % self.cfg.save_every == 0:
                self.save_state()
                self.export(self.out / "checkpoint")
            if deadline is not None and time.monotonic() > deadline:
                logger.info("time limit reached at step %d", self.step)
                break
        bar.close()
        self.save_state()
        return self.export(self.out / "checkpoint")

    def export(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.model_config, indent=2) + "\n")
        save_checkpoint(config_from_dict(self.model_config), self.model.state_dict(), directory)
        save_tokenizer(self.tokenizer, directory)
        meta = {
            "steps": self.step,
            "seed": self.cfg.seed,
            "final_loss": self.history[-1][1] if self.history else None,
        }
        (directory / "training.json").write_text(
            json.dumps(meta | {"config": asdict(self.cfg)}, indent=2) + "\n"
        )
        plot_loss(self.history, self.out / "loss.png")
        return directory
