"""A tool call's result as the text the model reads: text blocks joined, images, audio and binary resources
described (never shown: the model reads text), resource links named, structured content as compact JSON when
there is no text, and the whole cut to a cap with a note that says so.

The result comes from a tool server, so it is untrusted and may be huge: the text is built from slices of the
blocks, never by joining them whole first, so a 10 MB block costs one 10 MB string (the SDK's), not three."""

from __future__ import annotations

import json
from collections.abc import Iterator

import mcp_types as types

BLOCK_SEPARATOR = "\n"
EMPTY_RESULT = "(the tool returned nothing)"
EMPTY_ERROR = "(the tool reported an error and gave no message)"


def _base64_bytes(data: str) -> int:
    """The decoded size of base64 text, without decoding it (the data may be megabytes)."""
    data = data.rstrip()
    return max(0, len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))))


def _resource_text(block: types.EmbeddedResource) -> str:
    resource = block.resource
    if isinstance(resource, types.TextResourceContents):
        return resource.text
    mime = resource.mime_type or "unknown type"
    return f"[resource: {resource.uri}, {mime}, {_base64_bytes(resource.blob):,} bytes, not shown]"


def _block_text(block: object) -> str:
    """One content block as the model reads it."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent):
        return f"[image: {block.mime_type}, {_base64_bytes(block.data):,} bytes, not shown]"
    if isinstance(block, types.AudioContent):
        return f"[audio: {block.mime_type}, {_base64_bytes(block.data):,} bytes, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource: {block.uri} {block.name}]"
    if isinstance(block, types.EmbeddedResource):
        return _resource_text(block)
    kind = getattr(block, "type", type(block).__name__)
    return f"[a block of type {kind!s:.40}, not shown]"


def _pieces(result: types.CallToolResult) -> Iterator[str]:
    """The result's text, piece by piece (the pieces are the blocks' own strings: nothing copied yet)."""
    has_text = False
    for i, block in enumerate(result.content):
        if i:
            yield BLOCK_SEPARATOR
        text = _block_text(block)
        has_text = has_text or (isinstance(block, types.TextContent | types.EmbeddedResource) and bool(text))
        yield text
    if not has_text and result.structured_content is not None:
        # a tool that answers only in structured form; compact, as the model reads it best
        if result.content:
            yield BLOCK_SEPARATOR
        yield json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"), default=str)


def cut_note(total: int, shown: int) -> str:
    return f"[cut: the result was {total:,} characters; the first {shown:,} are shown]"


def capped(pieces: Iterator[str] | list[str], max_chars: int) -> tuple[str, int | None]:
    """The first ``max_chars`` characters of the pieces joined, and the whole length when it was cut (else None).
    Only what is shown is copied; the rest is only counted."""
    kept: list[str] = []
    room = max_chars
    total = 0
    for piece in pieces:
        total += len(piece)
        if room > 0:
            part = piece if len(piece) <= room else piece[:room]
            kept.append(part)
            room -= len(part)
    text = "".join(kept)
    if total <= max_chars:
        return text, None
    return f"{text}\n\n{cut_note(total, max_chars)}", total


def result_text(result: types.CallToolResult, max_chars: int) -> tuple[str, int | None]:
    """The text the model reads for ``result`` (at most ``max_chars`` characters and a note), and the result's
    length in characters when it was cut."""
    text, cut_from = capped(_pieces(result), max_chars)
    if not text.strip():
        return (EMPTY_ERROR if result.is_error else EMPTY_RESULT), None
    return text, cut_from
