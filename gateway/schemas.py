"""OpenAI request and response models (plus the dLLM extra body fields)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from dllm_contracts.canvas_sampler import SETTINGS as SAMPLER_SETTINGS
from dllm_contracts.structured_output import call_text
from gateway.openai_fields import BOTH, CHAT_ONLY, COMPLETIONS_ONLY, refuse_unless_harmless


def _encodable(text: str) -> str:
    """Text that UTF-8 can carry: a lone surrogate (valid JSON, "\\ud800") is not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (it has a lone surrogate)") from exc
    return text


Text = Annotated[str, AfterValidator(_encodable)]
# No coercion (`true` is not 1, "yes" is not true); fields OpenAI does not define are kept aside and refused
# by the handler (``openai_fields.unknown_fields``) unless the service ignores them, so the schema says none
# are allowed.
STRICT = ConfigDict(extra="allow", strict=True, json_schema_extra={"additionalProperties": False})
MAX_STOPS = 4  # as OpenAI


def _harmless_only(*fields: str):
    """A validator that refuses a non-harmless value of any of ``fields`` (see ``gateway.openai_fields``)."""
    return field_validator(*fields)(
        classmethod(lambda cls, value, info: refuse_unless_harmless(value, info.field_name))
    )


def _sampler_field(name: str, more: str = ""):
    """A DiffusionGemma sampler setting as a body field, with the range its config class validates."""
    bound = SAMPLER_SETTINGS[name]
    limit = {"ge" if bound.inclusive else "gt": bound.low}
    finite = {"allow_inf_nan": False} if bound.kind is float else {}
    return Field(None, **limit, **finite, description=f"DiffusionGemma's sampler: {bound.description}{more}")


class DllmFields(BaseModel):
    """Extra body fields for diffusion decoding. Block length and steps must equal the service's. The
    entropy-bound sampler's settings (DiffusionGemma's; unset: the checkpoint's generation config) are
    refused by a service whose model has no such sampler."""

    model_config = STRICT

    block_length: int | None = Field(None, ge=1, description="tokens per block (must match the service)")
    steps: int | None = Field(None, ge=1, description="denoising steps per block (must match the service)")
    threshold: float | None = Field(None, gt=0.0, le=1.0, description="confidence threshold for this request")
    max_denoising_steps: int | None = _sampler_field(
        "max_denoising_steps", " (the service's steps per block or fewer)"
    )
    entropy_bound: float | None = _sampler_field("entropy_bound")
    t_min: float | None = _sampler_field("t_min")
    t_max: float | None = _sampler_field("t_max")
    stability_threshold: int | None = _sampler_field("stability_threshold")
    confidence_threshold: float | None = _sampler_field("confidence_threshold")

    def sampler_settings(self) -> dict[str, int | float] | None:
        """The sampler settings this request sets, by name (the queue's ``sampler``); None: none."""
        given = {name: getattr(self, name) for name in SAMPLER_SETTINGS if getattr(self, name) is not None}
        return {name: SAMPLER_SETTINGS[name].kind(value) for name, value in given.items()} or None


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool | None = Field(None, description="a last chunk with the usage of every choice")
    include_obfuscation: bool | None = Field(
        None, description="accepted; chunks carry no obfuscation padding (their content is the same)"
    )


Stops = Annotated[list[Text], Field(max_length=MAX_STOPS)]


class CommonFields(DllmFields):
    model: Text
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Text | Stops | None = Field(None, description=f"up to {MAX_STOPS} strings that end the text")
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0 or absent: greedy decoding")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="nucleus sampling (with temperature > 0)")
    top_k: int | None = Field(None, ge=0, description="sample among the k likeliest tokens (0: all)")
    seed: int | None = Field(None, ge=0, lt=2**63, description="the same seed reproduces a sampled output")
    n: int = Field(1, ge=1, le=16, description="choices per prompt, each drawn with its own seed")
    user: Text | None = None
    # defined by OpenAI, not implemented: accepted only with a value that does nothing
    logit_bias: dict[str, int | float] | None = Field(None, description="not supported: empty only")
    presence_penalty: float | int | None = Field(None, description="not supported: 0 only")
    frequency_penalty: float | int | None = Field(None, description="not supported: 0 only")
    _common_harmless = _harmless_only(*BOTH)

    def alternatives(self) -> int | None:
        """How many alternatives per token the worker records (None: no log probabilities)."""
        return None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def wants_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


TokenIds = Annotated[list[int], Field(min_length=1)]


class CompletionRequest(CommonFields):
    prompt: Text | list[Text] | TokenIds | list[TokenIds] = Field(
        ..., description="text, list of texts, token ids, or lists of token ids"
    )
    logprobs: int | None = Field(
        None, ge=0, le=5, description="each token's log probability and this many alternatives"
    )
    echo: bool = Field(False, description="the prompt's text before the completion")
    best_of: int | None = Field(None, description="not supported: 1 only")
    suffix: Text | None = Field(None, description="not supported: empty only")
    _harmless = _harmless_only(*COMPLETIONS_ONLY)

    def alternatives(self) -> int | None:
        return self.logprobs


class ContentPart(BaseModel):
    """One part of a message's content: text parts are read (joined by newlines); other kinds are refused."""

    model_config = STRICT

    type: Text
    text: Text | None = None


class CalledFunction(BaseModel):
    model_config = STRICT

    name: Text
    arguments: Text = Field(..., description="the call's arguments: a JSON object, as a string")


class ToolCall(BaseModel):
    """A call an assistant message made (sent back in a conversation's history)."""

    model_config = STRICT

    id: Text
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[ContentPart] | None = Field(
        None, description="absent or null only beside tool_calls"
    )
    name: Text | None = Field(None, description="the participant's name (given to the chat template)")
    tool_call_id: Text | None = Field(None, description="a tool message: the call it answers")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant message: the calls it made")
    refusal: Text | None = Field(None, description="not supported")
    _harmless = _harmless_only("refusal")

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("invalid_value", "only an assistant message makes tool_calls")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("missing", "a message needs its content (null only beside tool_calls)")
        return self

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, content):
        for part in content if isinstance(content, list) else []:
            if part.type != "text":
                raise PydanticCustomError(
                    "unsupported_value",
                    "content parts of type '{kind}' are not supported: this model reads text only",
                    {"kind": part.type},
                )
            if part.text is None:
                raise PydanticCustomError("missing", "a text part needs its text")
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)

    def for_template(self) -> dict:
        """The message as a chat template reads it: role, content as text (an assistant's calls written
        after it as answers write them), the name if given, and a tool message's call id."""
        content = self.text() + "".join(
            call_text(c.function.name, c.function.arguments) for c in self.tool_calls or ()
        )
        out = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out | ({"name": self.name} if self.name else {})


class FunctionDefinition(BaseModel):
    model_config = STRICT

    name: Text
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema object (the supported subset)")
    strict: bool | None = Field(None, description="calls always follow the parameters schema here")


class Tool(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT

    name: Text


class NamedToolChoice(BaseModel):
    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = STRICT | ConfigDict(populate_by_name=True)

    name: Text
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="a JSON Schema object")
    strict: bool | None = Field(None, description="answers always follow the schema here")


class ResponseFormat(BaseModel):
    model_config = STRICT

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(CommonFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    logprobs: bool = Field(False, description="each token's log probability")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="alternatives per token (needs logprobs)")
    tools: list[Tool] | None = Field(None, description="functions the answer may call")
    functions: list | None = Field(None, description="deprecated: use tools (empty only)")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="none, auto (the default with tools), required, or the one function to call"
    )
    function_call: Text | dict | None = Field(None, description='deprecated: use tool_choice ("none" only)')
    parallel_tool_calls: bool | None = Field(None, description="false: one call at most (default: several)")
    response_format: ResponseFormat | None = Field(
        None, description="text, json_object (JSON mode) or json_schema (Structured Outputs)"
    )
    modalities: list[Text] | None = Field(None, description='["text"] only')
    audio: dict | None = Field(None, description="not supported")
    prediction: dict | None = Field(None, description="not supported")
    reasoning_effort: Text | None = Field(None, description="not supported")
    verbosity: Text | None = Field(None, description="not supported")
    web_search_options: dict | None = Field(None, description="not supported")
    store: bool | None = Field(None, description="completions are not stored: false only")
    service_tier: Text | None = Field(None, description='"auto" or "default" only')
    metadata: dict[str, Text] | None = None
    prompt_cache_key: Text | None = None
    safety_identifier: Text | None = None
    _harmless = _harmless_only(*CHAT_ONLY)

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
    system_fingerprint: str | None = None  # the served model and decoding settings (see GatewaySettings)
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[dict] | None = None  # [{"id", "type": "function", "function": {"name", "arguments"}}]


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
    system_fingerprint: str | None = None  # the served model and decoding settings (see GatewaySettings)
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
    max_prompt_tokens: int  # the longest prompt (with max_tokens 1)
    context_length: int  # the most tokens a prompt and its max_tokens take together
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
    status: Literal["uploaded", "processed", "error"] = "processed"  # stored whole: ready for use at once
    status_details: str | None = None
    expires_at: int | None = None  # when the file is deleted (its retention time after it was stored)


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
        "validating",
        "failed",
        "in_progress",
        "finalizing",
        "completed",
        "expired",
        "cancelling",
        "cancelled",
    ]
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    errors: dict | None = None
    metadata: dict[str, str] | None = None


class BatchList(ListPage):
    data: list[BatchObject]
