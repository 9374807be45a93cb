"""Torch-free tokenizer for the gateway: ``tokenizers`` plus the chat template rendered with Jinja."""

from __future__ import annotations

import json

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from dllm_contracts.model_context import context_length_of
from dllm_contracts.text import cut_at_eos
from gateway.chat_answers import tools_turn
from gateway.model_files import ModelFiles, model_files


class TokenizerError(ValueError):
    """The model directory has no usable tokenizer."""


def _compiled(template: str, model_dir: str):
    try:
        return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    except TemplateSyntaxError as exc:
        raise TokenizerError(f"the chat template in {model_dir!r} does not parse: {exc}") from None


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class GatewayTokenizer:
    def __init__(self, model_dir: str) -> None:
        """``model_dir``: a model directory, or a model named as ``dllm serve`` takes it (see
        ``gateway.model_files``)."""
        files = model_files(model_dir)
        directory = files.tokenizer_dir
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"no tokenizer.json in {model_dir!r}: the gateway needs the model's tokenizer"
            )
        self.tokenizer = Tokenizer.from_file(str(path))
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        template_file = directory / "chat_template.jinja"
        self.chat_template = (
            template_file.read_text() if template_file.is_file() else config.get("chat_template")
        )
        self.bos_token = _token_text(config.get("bos_token")) or ""
        self.eos_token = _token_text(config.get("eos_token")) or ""
        self.eos_ids = self._eos_ids(files)
        self.context_length = context_length_of(files.config)  # None: its config does not say
        # the most input bytes one token can stand for, at most: a vocabulary entry's length in UTF-8
        # (byte-level and byte-fallback entries spell each byte with one or more characters)
        self.max_token_bytes = max(len(t.encode()) for t in self.tokenizer.get_vocab(True)) or 1
        self._template = _compiled(self.chat_template, model_dir) if self.chat_template else None

    def _eos_ids(self, files: ModelFiles) -> set[int]:
        """The tokenizer's EOS token and every EOS id the configs name: config.json's (a multimodal
        config's under text_config, as DiffusionGemma's) and generation_config.json's (the engine stops
        at those too)."""
        ids = set()
        if self.eos_token and self.tokenizer.token_to_id(self.eos_token) is not None:
            ids.add(self.tokenizer.token_to_id(self.eos_token))
        model, generation = files.config, files.generation_config
        for config in (model, model.get("text_config") or {}, generation):
            value = config.get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
        return ids

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The messages as the chat template renders them; ``tools`` given to a template that takes them,
        else shown in a system turn before the messages (``chat_answers.tools_turn``)."""
        if self._template is None:
            raise TokenizerError("this model has no chat template: use /v1/completions")
        extra = {}
        if tools and self.takes_tools:
            extra["tools"] = tools
        elif tools:
            messages = [{"role": "system", "content": tools_turn(tools)}, *messages]
        text = self._template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            **extra,
        )
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template renders tools itself (it reads a ``tools`` variable)."""
        return bool(self.chat_template) and "tools" in self.chat_template

    def decode(self, token_ids: list[int]) -> str:
        """Text of the tokens before the first EOS, special tokens left out."""
        return self.tokenizer.decode(cut_at_eos(token_ids, self.eos_ids), skip_special_tokens=True)
