"""A request body read as JSON, bounded: nesting depth, number sizes and valid Unicode, so what reaches
the schema (and later the store and the tokenizer) cannot raise anything but a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator

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


def _children(value: dict | list) -> Iterator[tuple[object, object]]:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def check_tree(data: object) -> None:
    """Walk ``data`` depth first without recursion, holding one iterator per level (memory bounded by the
    depth, not the size): no deeper than MAX_DEPTH, and every string (key or value) valid Unicode; a JSON
    escape such as ``\\ud800`` decodes to a lone surrogate, which no store or tokenizer can encode."""
    if isinstance(data, str):
        _check_text(data, ())
    if not isinstance(data, dict | list):
        return
    levels, path = [_children(data)], []
    while levels:
        for key, item in levels[-1]:
            if isinstance(key, str):
                _check_text(key, tuple(path))
            if isinstance(item, str):
                _check_text(item, (*path, key))
            elif isinstance(item, dict | list):
                if len(levels) >= MAX_DEPTH:
                    where = _param((*path, key))
                    raise _bad(f"the body nests deeper than {MAX_DEPTH} levels (at {where})", where)
                levels.append(_children(item))
                path.append(key)
                break
        else:  # this level is done
            levels.pop()
            if path:
                path.pop()


def _check_text(text: str, path: tuple) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = _param(path)
        char = text[exc.start]
        raise _bad(f"{where + ': ' if where else ''}the text holds a lone surrogate (\\u{ord(char):04x}), which is "
                   "not a character: send valid Unicode", where, "invalid_value") from None
