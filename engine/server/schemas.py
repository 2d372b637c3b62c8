"""The requests the server accepts, as pydantic models of OpenAI's wire format.

Unknown fields are ignored (clients send many we have no use for); a known field with a bad value is
a 400 that names it. Turning a request into the engine's ``ServeRequest`` happens in ``requests.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.types import MAX_TOP_LOGPROBS

MAX_STOP_STRINGS = 4  # as OpenAI
MAX_STOP_CHARS = 256
RANDOM_SEED = -1  # llama.cpp's convention, which clients of local servers send: a fresh random seed
MAX_SEED = 2**64 - 1
MAX_TOOLS = 128  # as OpenAI
MAX_MESSAGES = 10_000  # the body's size bounds the text; this bounds the count of small ones
MAX_PARTS = 1_000  # content parts in one message
MAX_TOOL_CALLS = 128  # calls one assistant message may carry
MAX_ID_CHARS = 256  # a tool call's id (opaque to Hearth; clients echo ours back)
MAX_DESCRIPTION_CHARS = 16_384
MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs: keys; their JSON is bounded in requests.py
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class FunctionCall(_Lenient):
    name: str = Field(pattern=TOOL_NAME)
    # JSON text of an object, as OpenAI sends it (checked in requests.py); some clients send the object itself
    arguments: str | dict[str, Any] = ""


class ToolCallSpec(_Lenient):
    """An assistant message's call, as the client sends it back in the history."""

    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(max_length=MAX_PARTS)] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCallSpec] | None = Field(default=None, max_length=MAX_TOOL_CALLS)  # assistant
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_CHARS)  # tool
    reasoning_content: str | None = None  # assistant: its thinking, as a reasoning server returned it

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Lenient):
    include_usage: bool = False


class JsonSchemaSpec(_Lenient):
    name: str = Field(default="", max_length=64)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatSpec(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


Stop = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None


class _Sampling(_Lenient):
    """The fields chat and completions share."""

    model: str | None = Field(default=None, min_length=1, max_length=256)  # None: the loaded model
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: Stop = None
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    n: int = Field(default=1, ge=1)  # only 1: requests.py says so clearly
    user: str | None = Field(default=None, max_length=256)
    # Hearth extension: prompt-lookup decoding, draft up to this many tokens from the context (0 = off)
    prompt_lookup: int = Field(default=0, ge=0, le=64, strict=True)

    @field_validator("seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        if value is not None and value != RANDOM_SEED and not 0 <= value <= MAX_SEED:
            raise ValueError(f"the seed must be from 0 to {MAX_SEED}, or {RANDOM_SEED} for a random one; got {value}")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: Stop) -> Stop:
        for s in [value] if isinstance(value, str) else value or []:
            if len(s) > MAX_STOP_CHARS:
                raise ValueError(f"a stop string may be at most {MAX_STOP_CHARS} characters")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return tuple(s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s)


class FunctionSpec(_Lenient):
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    parameters: dict[str, Any] | None = None  # a JSON schema of an object
    strict: bool | None = None


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Lenient):
    name: str = Field(pattern=TOOL_NAME)


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(default=None, max_length=MAX_TEMPLATE_KWARGS)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormatSpec | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)  # the legacy API's count of alternatives
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
