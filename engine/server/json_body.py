"""A request body read as JSON, bounded: nesting depth, number sizes and valid Unicode, so what reaches
the schema (and later the store and the tokenizer) cannot raise anything but a 400."""

from __future__ import annotations

import json

from engine.server.errors import ApiError

MAX_DEPTH = 64  # OpenAI's requests nest a few levels; a response_format schema a few dozen at most


def _bad(message: str, param: str | None = None, code: str = "invalid_json") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def read_object(raw: bytes) -> dict:
    """``raw`` parsed as a JSON object; ApiError 400 for anything else, naming where it went wrong."""
    try:
        data = json.loads(raw)
    except RecursionError:  # nesting past the interpreter's limit: the parser gives up before we can count
        raise _bad(f"the body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # not JSON, not UTF-8, or a number longer than 4,300 digits
        raise _bad(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _bad("the body must be a JSON object")
    check_tree(data)
    return data


def _param(path: tuple) -> str | None:
    return ".".join(str(p) for p in path) or None


def check_tree(data: object) -> None:
    """Walk ``data`` without recursion: no deeper than MAX_DEPTH, and every string (key or value) valid
    Unicode; a JSON escape such as ``\\ud800`` decodes to a lone surrogate, which no store or tokenizer
    can encode."""
    stack: list[tuple[object, tuple]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, dict | list):
            continue
        if len(path) >= MAX_DEPTH:
            raise _bad(f"the body nests deeper than {MAX_DEPTH} levels (at {_param(path)})", _param(path))
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)
                stack.append((item, (*path, key)))
        else:
            stack.extend((item, (*path, i)) for i, item in enumerate(value))


def _check_text(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = _param(path)
        char = text[exc.start]
        raise _bad(f"{where + ': ' if where else ''}the text holds a lone surrogate (\\u{ord(char):04x}), which is "
                   "not a character: send valid Unicode", where, "invalid_value") from None
