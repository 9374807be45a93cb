"""DiffusionGemma's entropy-bound sampler: one denoising step for rows that may each be at a different
step of a different canvas, with adaptive stopping. It owns the per-row sampling state between steps.

The reference (transformers 5.24.0, ``generation_diffusion_gemma.py``: ``EntropyBoundSampler``,
``LinearTemperatureScheduleLogitsProcessor``, ``StableAndConfidentStoppingCriteria``, ``_denoising_step``).
A canvas of L tokens starts uniformly random. At each step, with ``n`` the steps left of at most N
(N, N-1, ..., 1):

1. processed = logits / (t_min + (t_max - t_min) * n / N), in float32;
2. a token per position is drawn from softmax(processed) (``torch.multinomial``), and the argmax taken;
3. acceptance: the positions sorted by entropy of softmax(processed), ascending; the first k are
   accepted where (cumulative entropy - the position's own entropy) <= entropy_bound, so always at
   least one; accepted positions take the drawn token, the others keep the step's input token;
4. renoising: every position not accepted this step gets a fresh uniform token. Nothing is frozen:
   a position accepted at one step is renoised at the next if it is not accepted again;
5. stop if stable (the argmax canvas equal at the last ``stability_threshold`` steps before, within
   this canvas; always stable for 0) and confident (mean entropy < confidence_threshold); the
   canvas committed is the step's argmax canvas, also after the last (N-th) step;
6. the processed logits condition the next step (``DiffusionGemmaModel.soft_embeddings``).

Random numbers come from one ``torch.Generator`` per row (per request), never from a global one, so
a row's draws do not depend on its batch neighbours. Per row and canvas: ``randint(0, V, (1, L))``
for the initial canvas; per step, ``multinomial`` of the row's [L, V] probabilities (one sample each)
then ``randint(0, V, (1, L))`` for the renoising (drawn whether or not any position needs it). These
are the reference's draws at batch 1 after ``torch.manual_seed(seed)``, in that order; the multinomial
draws of every row are made at once, bit for bit (``categorical_draws.py``).

The settings (``EntropyBoundParams``: defaults, ranges) are declared by the family
(``families/diffusion_gemma/sampler_settings.py``), whence the family table carries them to the gateway;
this module reads any object with their names (``SamplerSettings``). Each row has its own, on the device
as ``SamplerColumns`` (sent once per canvas). A step reads the device once (``CanvasStep.read``): every row's done flag and argmax canvas, and
what its draws need to finish (``categorical_draws.PendingDraws``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine_pod.decoding.categorical_draws import PendingDraws
from engine_pod.device_buffers import DeviceBuffers, Floats


class SamplerSettings(Protocol):
    """The settings one row samples with (a family's declaration of them: ``EntropyBoundParams``)."""

    max_denoising_steps: int
    entropy_bound: float
    t_min: float
    t_max: float
    stability_threshold: int
    confidence_threshold: float


@dataclass
class SamplerColumns:
    """Each row's settings as device columns [R]: what a step computes with (no copy per step)."""

    limits: torch.Tensor  # int64 max_denoising_steps
    t_low: torch.Tensor  # float32 t_min
    t_span: torch.Tensor  # float32 t_max - t_min
    needed: torch.Tensor  # int64 stability_threshold
    confidence: torch.Tensor  # float32 confidence_threshold
    bounds: torch.Tensor  # float32 entropy_bound

    @staticmethod
    def host_named(params: list[SamplerSettings]) -> dict[str, list[int] | Floats]:
        """The columns by name, for a caller's one copy (``DeviceBuffers.send``)."""
        return {
            "limits": [p.max_denoising_steps for p in params],
            "t_low": Floats(p.t_min for p in params),
            "t_span": Floats(p.t_max - p.t_min for p in params),
            "needed": [p.stability_threshold for p in params],
            "confidence": Floats(p.confidence_threshold for p in params),
            "bounds": Floats(p.entropy_bound for p in params),
        }

    @classmethod
    def of_sent(cls, sent: dict[str, torch.Tensor]) -> SamplerColumns:
        """From ``host_named`` on the device (floats rounded to float32 as ``torch.tensor`` rounds them)."""
        as_float = lambda name: sent[name].to(torch.float32)  # noqa: E731
        floats = {name: as_float(name) for name in ("t_low", "t_span", "confidence", "bounds")}
        return cls(limits=sent["limits"], needed=sent["needed"], **floats)

    @classmethod
    def of(cls, params: list[SamplerSettings], device: torch.device) -> SamplerColumns:
        return cls.of_sent(DeviceBuffers(device).send(cls.host_named(params)))  # buffers of these alone

    def select(self, index: torch.Tensor) -> SamplerColumns:
        return SamplerColumns(*(column.index_select(0, index) for column in vars(self).values()))


@dataclass
class CanvasSamplerState:
    """The sampling state of R rows between two steps, each row on its own canvas."""

    canvas: torch.Tensor  # [R, L] int64: the next decoder input (noisy tokens)
    steps_taken: torch.Tensor  # [R] int64: steps done on the current canvas
    stable_run: torch.Tensor  # [R] int64: consecutive earlier steps whose argmax equals the latest one
    argmax: torch.Tensor  # [R, L] int64: the latest step's argmax canvas (-1 before the first step)
    columns: SamplerColumns
    generators: list[torch.Generator]

    def select(self, index: torch.Tensor, rows: list[int]) -> CanvasSamplerState:
        """The state of ``rows`` alone (rows that go on stepping when the others have stopped); ``index``
        holds them on the device."""
        return CanvasSamplerState(
            canvas=self.canvas.index_select(0, index),
            steps_taken=self.steps_taken.index_select(0, index),
            stable_run=self.stable_run.index_select(0, index),
            argmax=self.argmax.index_select(0, index),
            columns=self.columns.select(index),
            generators=[self.generators[row] for row in rows],
        )


@dataclass
class CanvasStepDecision:
    """What one step decided for each row."""

    processed_logits: torch.Tensor  # [R, L, V] float32: the next step's self-conditioning input
    probabilities: torch.Tensor  # [R, L, V] float32: softmax(processed_logits), what the step drew from
    argmax: torch.Tensor  # [R, L]: the canvas a row commits when it is done
    done: torch.Tensor  # [R] bool: stopped adaptively or at its last step
    done_rows: list[bool]  # ``done`` as the host read it
    committed: list[list[int] | None]  # ``argmax`` as the host read it, for the rows that are done
    argmax_rows: list[list[int]] | None = None  # every row's ``argmax`` as read (where constrained rows ran)
    extra_rows: list[list[int]] | None = None  # the constrained rows' read columns (CanvasStep.extra)


def uniform_tokens(
    generators: list[torch.Generator], length: int, vocab_size: int, device: torch.device
) -> torch.Tensor:
    """[R, L] uniform tokens, row r drawn from generators[r] as ``randint(0, V, (1, L))``."""
    rows = [torch.randint(0, vocab_size, (1, length), generator=g, device=device) for g in generators]
    return torch.cat(rows)


def start_canvas(
    params: list[SamplerSettings] | SamplerColumns,
    generators: list[torch.Generator],
    length: int,
    vocab_size: int,
    device: torch.device,
) -> CanvasSamplerState:
    """Rows at the first step of a fresh canvas (the reference draws it after encoding the context);
    their settings as a list (sent to the device here) or as columns already there."""
    rows = len(generators)
    columns = params if isinstance(params, SamplerColumns) else SamplerColumns.of(params, device)
    return CanvasSamplerState(
        canvas=uniform_tokens(generators, length, vocab_size, device),
        steps_taken=torch.zeros(rows, dtype=torch.int64, device=device),
        stable_run=torch.zeros(rows, dtype=torch.int64, device=device),
        argmax=torch.full((rows, length), -1, dtype=torch.int64, device=device),
        columns=columns,
        generators=list(generators),
    )


def temperatures(columns: SamplerColumns | list[SamplerSettings], steps_left: torch.Tensor) -> torch.Tensor:
    """[R] float32 ``t_min + (t_max - t_min) * (n / N)``, rounded as the reference's float32 ops round."""
    if not isinstance(columns, SamplerColumns):
        columns = SamplerColumns.of(columns, steps_left.device)
    steps = columns.limits.to(torch.int32)
    return columns.t_low + columns.t_span * (steps_left.to(torch.int32) / steps)


# exp of anything below is subnormal or 0, which torch's vectorised exp computes 10-50 times slower
# than a normal result: most of a low temperature's vocabulary (its processed logits span thousands)
SUBNORMAL_EXP_BELOW = -87.0


def logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """``logits.logsumexp(dim=-1, keepdim=True)``, as torch computes it (the max, the exps of the shifted
    logits summed, the log, the max added back) with the shifted logits clamped at -87 before their exp.
    The sum holds the max's exp, exactly 1, so terms below 1.7e-38 (1024 of them add up to 2e-35) are
    beneath its rounding: the result is torch's bit for bit (tested), without the slow exps."""
    top = logits.amax(dim=-1, keepdim=True)
    top = top.masked_fill(top.abs() == float("inf"), 0)
    exps = (logits - top).clamp_(min=SUBNORMAL_EXP_BELOW).exp_()
    return exps.sum(dim=-1, keepdim=True).log_().add_(top)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim (``torch.distributions.Categorical``'s arithmetic)."""
    normalized = logits - logsumexp(logits)
    probabilities = torch.softmax(normalized, dim=-1)
    clamped = normalized.clamp_(min=torch.finfo(normalized.dtype).min)  # in place: the same values
    return -(clamped.mul_(probabilities)).sum(-1)


def accepted_positions(entropy: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """[R, L] bool: each row's lowest-entropy positions whose cumulative entropy, less the largest
    (their own), stays within the row's bound [R]."""
    ordered, order = torch.sort(entropy, dim=-1, descending=False)
    within = torch.cumsum(ordered, dim=-1) - ordered <= bounds[:, None]
    return torch.scatter(torch.zeros_like(within), dim=-1, index=order, src=within)


def _stopped(rows: CanvasSamplerState, argmax: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    """Stable-and-confident adaptive stopping; updates each row's stability run."""
    same = (argmax == rows.argmax).all(dim=-1)
    rows.stable_run = torch.where(same, rows.stable_run + 1, torch.zeros_like(rows.stable_run))
    return (rows.stable_run >= rows.columns.needed) & (entropy.mean(dim=-1) < rows.columns.confidence)


class CanvasStep:
    """One step for every row from the decoder's logits [R, L, V] on ``rows.canvas``, in three parts:
    the device's work (made here), the host's one read (``read``), and the rest (``finish``): ``rows``
    moves to its next canvas input; a row whose result says ``done`` commits ``argmax`` instead."""

    def __init__(self, rows: CanvasSamplerState, logits: torch.Tensor, grammar=None) -> None:
        """``grammar``: the constrained rows' part of the step (kinds/canvas/grammar.py), or None."""
        columns = rows.columns
        self.rows = rows
        steps_left = columns.limits - rows.steps_taken
        if grammar is not None:  # a constrained row may step past its last step: at its lowest temperature
            steps_left = steps_left.clamp(min=1)
        processed = logits / temperatures(columns, steps_left)[:, None, None]
        probabilities = torch.softmax(processed, dim=-1, dtype=torch.float32)
        self.draws = PendingDraws(probabilities, rows.generators)  # then the renoising, as the reference
        self.noise = uniform_tokens(rows.generators, logits.shape[1], logits.shape[-1], logits.device)
        argmax = torch.argmax(processed, dim=-1)
        entropy = token_entropy(processed)
        self.accepted = accepted_positions(entropy, columns.bounds)
        stopped = _stopped(rows, argmax, entropy)
        rows.argmax = argmax
        rows.steps_taken = rows.steps_taken + 1
        done = stopped | (rows.steps_taken >= columns.limits)
        self.extra = None  # the constrained rows' columns of the read (their frontier and accepted positions)
        if grammar is not None:
            done, self.extra = grammar.on_step(processed, self.accepted, done)
        self.partial = CanvasStepDecision(processed, probabilities, argmax, done, [], [])

    def read(self) -> list[list[int]]:
        """The step's one device read: per row its done flag, whether its draws are valid, its argmax
        canvas, then its draws' report (and the constrained rows' columns, last)."""
        step = self.partial
        flags = torch.stack([step.done, self.draws.valid.expand_as(step.done)], dim=1).to(torch.int64)
        parts = [flags, step.argmax, self.draws.report] + ([] if self.extra is None else [self.extra])
        return torch.cat(parts, dim=1).tolist()

    def finish(self, read: list[list[int]]) -> CanvasStepDecision:
        length = self.partial.argmax.shape[1]
        valid = all(values[1] for values in read)
        if self.extra is not None:  # the constrained rows' columns, taken off the end
            columns = self.extra.shape[1]
            self.partial.extra_rows = [values[-columns:] for values in read]
            read = [values[:-columns] for values in read]
        sampled = self.draws.finish([values[2 + length :] for values in read], valid)
        self.rows.canvas = torch.where(self.accepted, sampled, self.noise)
        result = self.partial
        result.done_rows = [bool(values[0]) for values in read]
        result.committed = [values[2 : 2 + length] if values[0] else None for values in read]
        if self.extra is not None:
            result.argmax_rows = [values[2 : 2 + length] for values in read]
        return result


def entropy_bound_step(rows: CanvasSamplerState, logits: torch.Tensor, grammar=None) -> CanvasStepDecision:
    """One whole step (``CanvasStep``: its device work, its one read, the rest)."""
    step = CanvasStep(rows, logits, grammar)
    return step.finish(step.read())
