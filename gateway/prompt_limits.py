"""How long a prompt may be: what the context leaves beside the request's ``max_tokens`` (OpenAI's rule),
and a fixed cap where the service sets one (``max_prompt_tokens``). A prompt past either is a 400 with
OpenAI's ``context_length_exceeded`` code, its message naming the numbers."""

from __future__ import annotations

from gateway.errors import ApiError

FALLBACK_CONTEXT = 4096  # a model whose config names no context and whose family is unknown


def context_of(state) -> int:
    """The service's context: the setting, else the model's (its config.json), else FALLBACK_CONTEXT."""
    return state.settings.context_length or state.tokenizer.context_length or FALLBACK_CONTEXT


def longest_prompt(state) -> int:
    """The longest prompt any request may have (one with ``max_tokens`` 1): what /v1/models reports and
    what a prompt's size in bytes is checked against before it is tokenized."""
    cap = state.settings.max_prompt_tokens
    room = context_of(state) - 1
    return min(cap, room) if cap else room


def prompt_too_long(
    tokens: int, max_tokens: int | None, state, param: str = "prompt", at_least: bool = False
) -> ApiError | None:
    """The refusal of a prompt of ``tokens`` tokens asking for ``max_tokens`` more (None: not known yet,
    counted as 1); None when it fits."""
    cap, context = state.settings.max_prompt_tokens, context_of(state)
    count = f"at least {tokens}" if at_least else str(tokens)
    if cap and tokens > cap:
        message = f"the prompt has {count} tokens; this service accepts at most {cap}"
        return ApiError(400, message, param=param, code="context_length_exceeded")
    asked = 1 if max_tokens is None else max_tokens
    if tokens + asked <= context:
        return None
    if max_tokens is None:
        message = f"the prompt has {count} tokens; this model's maximum context length is {context} tokens"
    else:
        message = (
            f"this model's maximum context length is {context} tokens, but {count} prompt tokens and "
            f"max_tokens {max_tokens} were requested ({tokens + max_tokens} in all): shorten the prompt "
            "or lower max_tokens"
        )
    return ApiError(400, message, param=param, code="context_length_exceeded")
