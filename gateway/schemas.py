"""OpenAI request and response models (plus the dLLM extra body fields)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _encodable(text: str) -> str:
    """Text that UTF-8 can carry: a lone surrogate (valid JSON, "\\ud800") is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from exc
    return text


Text = Annotated[str, AfterValidator(_encodable)]
STRICT = ConfigDict(extra="allow", strict=True)  # no coercion: `true` is not 1, "yes" is not true


class DllmFields(BaseModel):
    """Extra body fields for diffusion decoding. Block length and steps must equal the service's."""

    model_config = STRICT

    block_length: int | None = Field(None, ge=1, description="tokens per block (must match the service)")
    steps: int | None = Field(None, ge=1, description="denoising steps per block (must match the service)")
    threshold: float | None = Field(None, gt=0, le=1, description="confidence threshold for this request")


class CommonFields(DllmFields):
    model: Text
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: dict | None = None
    stop: Text | list[Text] | None = None
    temperature: float | None = Field(None, ge=0, le=2, description="0 or absent: greedy decoding")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling (with temperature > 0)")
    top_k: int | None = Field(None, ge=0, description="sample among the k likeliest tokens (0: all)")
    seed: int | None = Field(None, ge=0, lt=2**63, description="the same seed reproduces a sampled output")
    n: int = Field(1, ge=1, le=16, description="choices per prompt, each drawn with its own seed")
    user: Text | None = None

    def alternatives(self) -> int | None:
        """How many alternatives per token the worker records (None: no log probabilities)."""
        return None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(CommonFields):
    prompt: Text | list[Text] | list[int] = Field(..., description="text, list of texts, or token ids")
    logprobs: int | None = Field(
        None, ge=0, le=5, description="each token's log probability and this many alternatives"
    )
    echo: bool = Field(False, description="the prompt's text before the completion")

    def alternatives(self) -> int | None:
        return self.logprobs


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text


class ChatCompletionRequest(CommonFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    logprobs: bool = Field(False, description="each token's log probability")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="alternatives per token (needs logprobs)")

    def alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dllm"
    block_length: int
    steps_per_block: int
    threshold: float
    max_prompt_tokens: int
    max_tokens: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str


class ListPage(BaseModel):
    """OpenAI's cursor-paginated list: a page of objects and where it starts and ends."""

    object: Literal["list"] = "list"
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    @classmethod
    def of(cls, items: list, has_more: bool):
        first, last = (items[0].id, items[-1].id) if items else (None, None)
        return cls(data=items, has_more=has_more, first_id=first, last_id=last)


class FileList(ListPage):
    data: list[FileObject]


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreate(BaseModel):
    model_config = ConfigDict(strict=True)

    input_file_id: str
    endpoint: Literal["/v1/completions", "/v1/chat/completions"]
    completion_window: Literal["24h"] = "24h"
    metadata: dict[str, str] | None = None


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    input_file_id: str
    completion_window: str = "24h"
    status: Literal[
        "validating", "failed", "in_progress", "finalizing", "completed", "cancelling", "cancelled"
    ]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    completed_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    errors: dict | None = None
    metadata: dict[str, str] | None = None


class BatchList(ListPage):
    data: list[BatchObject]
