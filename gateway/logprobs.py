"""OpenAI's ``logprobs`` objects from a result's per-token log probabilities, whole or chunk by chunk.

For a diffusion model a token's log probability is the one it had under the distribution of the step
that committed it (the denoising step at which it was unmasked, not a left-to-right prediction); the
alternatives are that distribution's likeliest tokens. A block whose record was lost (a worker that
died before Redis stored it) has none (null).
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm_contracts.queue.messages import DoneEvent

Entry = list | tuple | None  # [log p, [[alternative id, log p], ...]] or None
INCOMPLETE = "\ufffd"  # how a decoder shows the bytes of a character that has not all come


CONTEXT_TOKENS = 4  # tokens before an alternative that its piece is decoded after


@dataclass(frozen=True)
class _Item:
    """One described token: its piece of the text, its entry, and what an alternative's piece needs."""

    piece: str
    entry: Entry
    token_id: int = -1
    context: tuple[int, ...] = ()  # the tokens just before it

    def alternatives(self, tokenizer) -> list[tuple[str, float]]:
        """Each alternative's piece as it would read in this place (a decoder can drop a leading space
        of a token decoded alone) and its log probability; the chosen token's is its own piece."""
        if not self.entry:
            return []
        return [
            (self.piece if i == self.token_id else _piece_after(tokenizer, self.context, i), v)
            for i, v in self.entry[1]
        ]


def _piece_after(tokenizer, context: tuple[int, ...], token_id: int) -> str:
    decode = tokenizer.tokenizer.decode
    before = decode(list(context), skip_special_tokens=False)
    after = decode([*context, token_id], skip_special_tokens=False)
    return after[len(before) :] if after.startswith(before) else decode([token_id], skip_special_tokens=False)


def visible_tokens(token_ids: list[int], entries: list | None, tokenizer) -> list[tuple[int, Entry]]:
    """The tokens the text shows (before the first EOS) with their recorded entries."""
    entries = entries or []
    out = []
    for index, token in enumerate(token_ids):
        if token in tokenizer.eos_ids:
            break
        out.append((token, entries[index] if index < len(entries) else None))
    return out


def held_back(text: str) -> str:
    """``text`` without the character whose bytes have not all come: a byte-level tokenizer's prefix that
    ends inside a character decodes it as U+FFFD, which the next token turns into the character."""
    return text.rstrip(INCOMPLETE)


class _Pieces:
    """Each token's share of the decoded text (decoding the prefix up to it, minus the one before), so
    the pieces join into exactly the text a client got (a decoder may add spaces between tokens). A token
    that ends inside a character has an empty piece; the token that completes it carries the character
    (a text cut inside a character ends with a U+FFFD that no piece carries)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.before = ""

    def peek(self, token_ids: list[int], end: int) -> tuple[str, str]:
        """The piece of token ``end - 1`` and the text up to it (nothing advances)."""
        text = held_back(self.tokenizer.decode(token_ids[:end]))
        return (text[len(self.before) :] if text.startswith(self.before) else text), text

    def next(self, token_ids: list[int], end: int) -> str:
        piece, self.before = self.peek(token_ids, end)
        return piece


def _completion_object(items: list[_Item], tokenizer, offset: int) -> dict:
    tokens, values, tops, offsets = [], [], [], []
    for item in items:
        tokens.append(item.piece)
        offsets.append(offset)
        offset += len(item.piece)
        values.append(item.entry[0] if item.entry else None)
        tops.append(dict(item.alternatives(tokenizer)) if item.entry else None)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def _chat_object(items: list[_Item], tokenizer) -> dict:
    def token(piece: str, value: float | None) -> dict:
        return {"token": piece, "logprob": value, "bytes": list(piece.encode())}

    content = []
    for item in items:
        alternatives = [token(piece, v) for piece, v in item.alternatives(tokenizer)]
        value = item.entry[0] if item.entry else None
        content.append(token(item.piece, value) | {"top_logprobs": alternatives})
    return {"content": content, "refusal": None}


def _item(piece: str, token_ids: list[int], index: int, entry: Entry) -> _Item:
    context = tuple(token_ids[max(0, index - CONTEXT_TOKENS) : index])
    return _Item(piece, entry, token_ids[index], context)


def _described(tokenizer, token_ids: list[int], entries: list) -> list[_Item]:
    pieces = _Pieces(tokenizer)
    return [_item(pieces.next(token_ids, i + 1), token_ids, i, e) for i, e in enumerate(entries)]


def within_text(visible: list[tuple[int, Entry]], tokenizer, text_len: int | None) -> list[tuple[int, Entry]]:
    """The tokens whose text lies within the first ``text_len`` characters (a stop string cut the text
    there: a token it cuts is not described, as in a stream); all of them when ``text_len`` is None."""
    if text_len is None:
        return visible
    token_ids, kept = [t for t, _ in visible], len(visible)
    while kept and len(tokenizer.decode(token_ids[:kept])) > text_len:
        kept -= 1
    return visible[:kept]


def completion_logprobs(
    done: DoneEvent, tokenizer, prefix: list[int] = (), text_len: int | None = None
) -> dict:
    """The completions API's object: tokens, token_logprobs, top_logprobs, text_offset (``prefix``: the
    echoed prompt's tokens, whose log probabilities are null; ``text_len``: see ``within_text``)."""
    visible = within_text(visible_tokens(done.token_ids, done.logprobs, tokenizer), tokenizer, text_len)
    items = _described(tokenizer, list(prefix), [None] * len(prefix))
    items += _described(tokenizer, [t for t, _ in visible], [e for _, e in visible])
    return _completion_object(items, tokenizer, 0)


def chat_logprobs(done: DoneEvent, tokenizer, text_len: int | None = None) -> dict:
    """The chat API's object: one entry per content token, with its bytes and alternatives."""
    visible = within_text(visible_tokens(done.token_ids, done.logprobs, tokenizer), tokenizer, text_len)
    return _chat_object(_described(tokenizer, [t for t, _ in visible], [e for _, e in visible]), tokenizer)


class StreamedLogprobs:
    """A streamed choice's ``logprobs``, chunk by chunk: each chunk describes the tokens whose text it
    completes, so the chunks' objects joined are the whole result's object."""

    def __init__(self, tokenizer, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.pieces = _Pieces(tokenizer)
        self.described = 0  # tokens described so far
        self.offset = 0  # completions' text_offset of the next token

    def echoed(self, prefix: list[int]) -> dict:
        """The echoed prompt's tokens (completions only), with null log probabilities."""
        items = _described(self.tokenizer, prefix, [None] * len(prefix))
        self.offset = sum(len(item.piece) for item in items)
        return _completion_object(items, self.tokenizer, 0)

    def take(self, visible: list[tuple[int, Entry]], text_len: int) -> dict | None:
        """The object for the tokens of ``visible`` not yet described whose text lies within the first
        ``text_len`` characters sent (a stop string can cut a token's text: it is not described)."""
        token_ids = [t for t, _ in visible]
        items = []
        while self.described < len(visible):
            piece, text = self.pieces.peek(token_ids, self.described + 1)
            if len(text) > text_len:
                break
            self.pieces.before = text
            items.append(_item(piece, token_ids, self.described, visible[self.described][1]))
            self.described += 1
        if not items:
            return None
        if self.chat:
            return _chat_object(items, self.tokenizer)
        described = _completion_object(items, self.tokenizer, self.offset)
        self.offset += sum(len(item.piece) for item in items)
        return described
