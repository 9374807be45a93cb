"""Prompt text to token ids, with the tokenizer's chat template when asked."""

from __future__ import annotations

from typing import Any


class PromptError(ValueError):
    """A prompt that cannot be encoded."""


def encode_prompt(tokenizer: Any, text: str, chat: bool = False) -> list[int]:
    if tokenizer is None:
        raise PromptError("this model directory has no tokenizer: pass --prompt-ids instead of --prompt")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise PromptError("the tokenizer has no chat template: drop --chat")
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(text)["input_ids"]
    if not ids:
        raise PromptError("the prompt encodes to no tokens")
    return list(ids)


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a chat conversation, ending with the assistant's turn opening."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise PromptError("the model's tokenizer has no chat template")
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
