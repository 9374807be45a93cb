"""An answer to a request with tools, read back: content, or the calls it makes.

Answers write calls as ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``, one after another
(dllm_contracts/structured_output.py; their grammar keeps them so). ``read_calls`` reads any prefix of
such an answer: the calls whose name is complete, each with its arguments as far as written (the text of
their JSON object exactly as the answer wrote it), so a stream sends the same calls, in pieces, as the
whole answer shows (``CallStream``). An answer that does not start with a call is content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from dllm_contracts.structured_output import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_NAME_START = '{"name": '
_ARGUMENTS = ', "arguments": '


@dataclass
class ReadCall:
    name: str
    arguments: str  # the JSON object's text so far
    complete: bool  # its arguments are whole


def is_calls(text: str) -> bool | None:
    """Whether ``text`` (an answer, or its beginning) makes calls; None: too short to tell."""
    if text.startswith(TOOL_CALL_OPEN):
        return True
    return None if TOOL_CALL_OPEN.startswith(text) else False


def read_calls(text: str) -> list[ReadCall]:
    """The calls in ``text`` (calls, or the beginning of them) whose name is complete."""
    calls, at = [], 0
    while text.startswith(TOOL_CALL_OPEN + _NAME_START, at):
        at += len(TOOL_CALL_OPEN + _NAME_START)
        try:
            name, end = json.JSONDecoder().raw_decode(text, at)
        except json.JSONDecodeError:
            break
        if not text.startswith(_ARGUMENTS, end):
            break
        start = end + len(_ARGUMENTS)
        stop = _object_end(text, start)
        calls.append(ReadCall(str(name), text[start : len(text) if stop is None else stop], stop is not None))
        if stop is None:
            break
        at = stop + len("}" + TOOL_CALL_CLOSE)
    return calls


def _object_end(text: str, start: int) -> int | None:
    """Where the JSON object starting at ``start`` ends (past its closing brace); None: not yet."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            escaped, in_string = (not escaped and c == "\\"), in_string and (escaped or c != '"')
            continue
        if c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def call_id(response_id: str, index: int) -> str:
    """A call's id: the same for the same response and call."""
    return "call_" + hashlib.sha256(f"{response_id}:{index}".encode()).hexdigest()[:24]


def message_calls(calls: list[ReadCall], response_id: str) -> list[dict]:
    """The calls as a message's ``tool_calls``."""
    return [
        {
            "id": call_id(response_id, i),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for i, call in enumerate(calls)
    ]


class CallStream:
    """A streamed answer's calls as OpenAI streams them: a call's first delta its index, id, type, name and
    empty arguments, later ones pieces of its arguments."""

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.sent: list[int] = []  # per call: arguments' characters sent

    def deltas(self, text: str) -> list[dict]:
        """The ``tool_calls`` delta entries that ``text`` (the answer so far) adds to those sent."""
        out = []
        for i, call in enumerate(read_calls(text)):
            if i == len(self.sent):
                self.sent.append(0)
                out.append(
                    {
                        "index": i,
                        "id": call_id(self.response_id, i),
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                )
            piece = call.arguments[self.sent[i] :]
            if piece:
                self.sent[i] = len(call.arguments)
                out.append({"index": i, "function": {"arguments": piece}})
        return out
