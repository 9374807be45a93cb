"""A chat answer as OpenAI shapes it: content, or (for a request whose tools the answer may call) the
calls it makes, its finish reason ``tool_calls`` when it ended by itself; the same whole, streamed and in
a batch line's output. And the prompt such a request renders: its tools where the chat template takes
them, else in a system turn (docs/api.md#tool-calls)."""

from __future__ import annotations

import json

from gateway.response_grammar import tool_choice_of
from gateway.tool_calls import is_calls, message_calls, read_calls

TOOLS_META = "tool_calls"  # a batch line's meta entry: its answer may make calls (read back as such)
TOOLS_INTRO = (
    "You may call these tools. To call one, answer "
    '<tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call> for each call.'
)


def answers_with_calls(body) -> bool:
    """Whether the request's answer may make calls (tools given and ``tool_choice`` not ``none``)."""
    return hasattr(body, "tools") and tool_choice_of(body) != "none"


def chat_message(text: str, reason: str, with_calls: bool, response_id: str) -> tuple[dict, str]:
    """The answer's message (role, content, tool_calls) and finish reason."""
    if not with_calls or not is_calls(text):
        return {"role": "assistant", "content": text}, reason
    calls = message_calls(read_calls(text), response_id)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": calls,
    }, "tool_calls" if reason == "stop" else reason


def tools_for_prompt(body) -> list[dict] | None:
    """The tools as a chat template takes them (None: the prompt shows none, as when none may be called)."""
    if not answers_with_calls(body):
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


def tools_turn(tools: list[dict]) -> str:
    """The system turn that shows ``tools`` to a model whose chat template does not take them."""
    return "\n".join([TOOLS_INTRO, *(json.dumps(tool) for tool in tools)])
