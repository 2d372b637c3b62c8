"""The Anthropic Messages API's requests as pydantic models (``POST /v1/messages`` and
``/v1/messages/count_tokens``), as the official ``anthropic`` client (2.x) sends them.

Unknown fields are ignored (the client sends several Hearth has no use for: ``service_tier``,
``container``...); a known field with a bad value is a 400 naming it. Blocks Hearth cannot read (images,
documents, server tools) are parsed so that ``anthropic_requests.py`` can refuse them by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.server.schemas import MAX_DESCRIPTION_CHARS, MAX_ID_CHARS, MAX_MESSAGES, MAX_TOOLS, TOOL_NAME

MAX_STOP_SEQUENCES = 16  # the engine's limit (Anthropic sets none); agents pass a few turn markers
MAX_STOP_CHARS = 512
MAX_BLOCKS = 1_000  # in one message
MIN_THINKING_BUDGET = 1024  # as Anthropic


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CacheControl(_Lenient):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None  # Hearth's saved context has no time limit: accepted, not needed


class TextBlock(_Lenient):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class UnreadableBlock(_Lenient):
    """A block Hearth's text models cannot read: refused in anthropic_requests.py, naming its type."""

    type: Literal["image", "document", "search_result", "server_tool_use", "web_search_tool_result",
                  "container_upload"]
    cache_control: CacheControl | None = None


class ToolUseBlock(_Lenient):
    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


ResultPart = Annotated[TextBlock | UnreadableBlock, Field(discriminator="type")]


class ToolResultBlock(_Lenient):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    content: str | list[ResultPart] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(_Lenient):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Lenient):
    type: Literal["redacted_thinking"]
    data: str = ""


Block = Annotated[TextBlock | UnreadableBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
                  Field(discriminator="type")]


class AnthropicMessage(_Lenient):
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(max_length=MAX_BLOCKS)]


class AnthropicTool(_Lenient):
    """A client tool; ``type`` names a server tool (``web_search_…``, ``bash_…``), which Hearth does not run."""

    name: str = Field(pattern=TOOL_NAME)
    description: str | None = Field(default=None, max_length=MAX_DESCRIPTION_CHARS)
    input_schema: dict[str, Any] | None = None
    type: str | None = Field(default=None, max_length=64)
    cache_control: CacheControl | None = None


class AnthropicToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, pattern=TOOL_NAME)
    disable_parallel_tool_use: bool = False


class Thinking(_Lenient):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=MIN_THINKING_BUDGET)


class OutputFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Lenient):
    """Structured output (``format``: the reply is JSON valid against the schema) and ``effort``."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(_Lenient):
    user_id: str | None = Field(default=None, max_length=256)


class CountTokensRequest(_Lenient):
    """What count_tokens reads: the prompt's parts (no sampling, no max_tokens)."""

    model: str | None = Field(default=None, min_length=1, max_length=256)  # None: the loaded model
    system: str | Annotated[list[TextBlock], Field(max_length=MAX_BLOCKS)] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[AnthropicTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None  # a breakpoint on the last block (automatic caching)


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)  # required, as Anthropic's
    stop_sequences: list[Annotated[str, Field(max_length=MAX_STOP_CHARS)]] | None = Field(
        default=None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False
