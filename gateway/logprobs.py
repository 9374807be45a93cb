"""OpenAI's ``logprobs`` objects from a result's per-token log probabilities.

For a diffusion model a token's log probability is the one it had under the distribution of the step
that committed it (the denoising step at which it was unmasked, not a left-to-right prediction); the
alternatives are that distribution's likeliest tokens. Tokens committed on another worker before a
hand-over have none (null).
"""

from __future__ import annotations

from engine_pod.queue.messages import DoneEvent


def _pieces(tokenizer, token_ids: list[int]) -> list[str]:
    """Each token's share of the decoded text (decoding the prefix up to it, minus the one before), so
    the pieces join into exactly the text a client got (a decoder may add spaces between tokens)."""
    pieces, before = [], ""
    for end in range(1, len(token_ids) + 1):
        text = tokenizer.decode(token_ids[:end])
        pieces.append(text[len(before) :] if text.startswith(before) else text)
        before = text
    return pieces


def _piece(tokenizer, token_id: int) -> str:
    return tokenizer.tokenizer.decode([token_id], skip_special_tokens=False)


def _visible(done: DoneEvent, tokenizer) -> list[tuple[int, list | None]]:
    """The tokens the text shows (before the first EOS) with their recorded entries."""
    entries = done.logprobs or []
    out = []
    for index, token in enumerate(done.token_ids):
        if token in tokenizer.eos_ids:
            break
        out.append((token, entries[index] if index < len(entries) else None))
    return out


def completion_logprobs(done: DoneEvent, tokenizer, prefix: list[int] = ()) -> dict:
    """The completions API's object: tokens, token_logprobs, top_logprobs, text_offset (``prefix``: the
    echoed prompt's tokens, whose log probabilities are null)."""
    visible = _visible(done, tokenizer)
    pieces = _pieces(tokenizer, list(prefix)) + _pieces(tokenizer, [t for t, _ in visible])
    tokens, values, tops, offsets, at = [], [], [], [], 0
    for piece, (_, entry) in zip(pieces, [(t, None) for t in prefix] + visible):
        tokens.append(piece)
        offsets.append(at)
        at += len(piece)
        values.append(entry[0] if entry else None)
        tops.append({_piece(tokenizer, i): v for i, v in entry[1]} if entry else None)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(done: DoneEvent, tokenizer) -> dict:
    """The chat API's object: one entry per content token, with its bytes and alternatives."""

    def item(piece: str, value: float | None) -> dict:
        return {"token": piece, "logprob": value, "bytes": list(piece.encode())}

    visible = _visible(done, tokenizer)
    content = []
    for piece, (_, entry) in zip(_pieces(tokenizer, [t for t, _ in visible]), visible):
        alternatives = [item(_piece(tokenizer, i), v) for i, v in entry[1]] if entry else []
        content.append(item(piece, entry[0] if entry else None) | {"top_logprobs": alternatives})
    return {"content": content, "refusal": None}
