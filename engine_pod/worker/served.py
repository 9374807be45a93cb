"""The worker's one record of a request it serves, and the events it publishes from it.

Beside the scheduler's ``Request`` (its tokens, blocks and status), a served request carries what only
its client needs: the meta echoed in its result, whether it streams, and the log probabilities of its
committed tokens when it asked for them. The answer is cut to ``max_tokens`` here, once, for block events
and the result alike (whole blocks, and on a block-diffusion grid the last block, can overshoot it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dllm_contracts.model_identity import ModelIdentity, model_mismatch
from dllm_contracts.queue.messages import BATCH_META, BlockEvent, DoneEvent
from dllm_contracts.queue.ops import BlockCommit, Claimed
from dllm_contracts.request_params import RequestParams, family_settings_error
from dllm_contracts.text import completion_tokens, within_limit
from engine_pod.runner.contract import Runner
from engine_pod.scheduler.request import FinishReason, Request


def settings_problem(runner: Runner, params: RequestParams) -> str | None:
    """Why ``runner`` cannot serve a request's settings: family settings its model's family does not take
    (or not over the service's values), a response grammar it cannot use; None: it can."""
    family = runner.loaded.family.display_name
    problem = family_settings_error(params.family, runner.request_defaults, family)
    if problem is None and params.grammar is not None:
        problem = runner.grammar_problem(params.grammar)
    return problem


@dataclass
class ServedRequest:
    request: Request  # the scheduler's record: tokens, blocks, status (its finish_reason is the result's)
    meta: dict  # the payload's meta, echoed in its done event (a batch line's custom_id)
    stream: bool = False  # its client reads each block (else it waits for the result)
    logprobs: list | None = None  # per committed token, for a request that asked (None: it did not)
    error: str | None = None  # why it was refused (finish reason ERROR)

    @classmethod
    def claimed(
        cls,
        claimed: Claimed,
        request: Request,
        served_model: ModelIdentity | None = None,
        settings_problem: Callable[[RequestParams], str | None] | None = None,
    ) -> ServedRequest:
        """The record of a claimed request (the scheduler's ``request``, built with its settings), its
        committed blocks and their log probabilities as Redis recorded them; refused if its payload has
        fields this version does not know (named), if it was accepted for a model other than
        ``served_model``, if its settings are invalid, or if this engine cannot serve them
        (``settings_problem`` says why: family settings the served family does not take, a response
        grammar it cannot use)."""
        payload = claimed.request
        request.generated = list(claimed.generated)
        served = cls(request, payload.meta, payload.stream)
        if claimed.unknown_fields:
            names = ", ".join(claimed.unknown_fields)
            served.refuse(f"{names}: unknown to this engine (sent by a newer gateway); upgrade the engine")
            return served
        mismatch = model_mismatch(payload.model, served_model)
        if mismatch:
            served.refuse(mismatch)
            return served
        if payload.params.logprobs is not None:  # blocks committed elsewhere: as recorded in Redis
            restored = claimed.logprobs[: len(claimed.generated)]
            served.logprobs = restored + [None] * (len(claimed.generated) - len(restored))
        if claimed.invalid_settings is not None:
            served.refuse(f"invalid request settings: {claimed.invalid_settings}")
            return served
        problem = settings_problem(payload.params) if settings_problem is not None else None
        if problem:
            served.refuse(problem)
        return served

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def in_batch(self) -> bool:
        return bool(self.meta.get(BATCH_META))

    @property
    def limit(self) -> int:
        """Tokens the client may see: its max_tokens."""
        return self.request.max_tokens or len(self.request.generated)

    def refuse(self, error: str) -> None:
        self.request.finish_reason, self.error = FinishReason.ERROR, error

    def commit(self, block: list[int], values: list | None, block_length: int) -> BlockCommit:
        """The record of the block this cycle committed (already in ``request.generated``): its progress,
        its log probabilities (``values``, for a request that asked) and, for a streaming client, its
        event, cut to max_tokens."""
        request = self.request
        index = request.blocks_done(block_length) - 1
        logprobs = None
        if self.logprobs is not None:
            logprobs = list(values) if values is not None else [None] * len(block)
            self.logprobs.extend(logprobs)
        event = None
        offset = len(request.generated) - len(block)
        shown = max(0, self.limit - offset)
        if self.stream and shown:
            event = BlockEvent(index, block[:shown], None if logprobs is None else logprobs[:shown], offset)
        return BlockCommit(
            self.request_id, event, list(request.generated), request.prefix_len(), index, logprobs
        )

    def done(self, worker_id: str, eos_ids: Iterable[int], ignore_eos: bool) -> DoneEvent:
        """Its result: a generation that ran to its end is cut to max_tokens, as OpenAI's API says (its
        reason then "stop" if an EOS came within them, else "length")."""
        request, reason = self.request, self.request.finish_reason or FinishReason.LENGTH
        generated, status = request.generated, reason.value
        eos = list(eos_ids)
        if reason.ran_to_end:
            generated, status = within_limit(generated, self.limit, eos, ignore_eos)
        logprobs = None if self.logprobs is None else self.logprobs[: len(generated)]
        return DoneEvent(
            token_ids=list(generated),
            finish_reason=status,
            prompt_tokens=request.prompt_len,
            completion_tokens=completion_tokens(generated, eos),  # 0 for none
            worker=worker_id,
            error=self.error,
            meta=self.meta,
            logprobs=logprobs,
        )
