"""A jinja2 sandbox that bounds what a chat template may cost: time, loop steps, sizes and arithmetic.

Templates come from model files, so a hostile one must fail cleanly instead of hanging the process
or filling its memory. jinja2's own sandbox only stops attribute escapes; this one also:

- refuses huge powers and multiplications of integers (``10**10000000`` would take half a minute),
- refuses ``*``, ``+``, ``~``, ``%`` and growing string methods/filters that would build text or a
  list longer than the size cap (``'a'*300000000``), and charges what they build to a per-render
  allocation budget,
- counts every loop step (``range`` is a counting generator and every ``for`` runs over a counting
  wrapper), so nested loops stop at the step budget,
- caps the depth of nested calls (recursive macros), the rendered output, and the wall time.

Every refusal is a :class:`~engine.errors.TemplateError` naming the limit.
"""

from __future__ import annotations

import contextvars
import functools
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_environment
from jinja2.filters import make_attrgetter
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from engine.errors import TemplateError

MAX_SOURCE_CHARS = 1_000_000  # the largest real chat templates (with tool schemas) are tens of kB
MAX_INT_BITS = 4096  # integers beyond this have no place in a prompt
MAX_CALL_DEPTH = 64  # nested calls: macros calling macros; only recursion goes deeper
WIDTH_CAP = 100_000  # padding widths, tab sizes and format widths


@dataclass
class Budget:
    """What one render may still spend; sized from the messages so long conversations render."""

    deadline: float
    steps: int  # loop iterations
    allocation: int  # characters/items built by operators, methods and filters
    output: int  # characters written out
    sequence_cap: int  # the longest single string or list an operation may build
    depth: int = 0

    @classmethod
    def for_input(cls, input_chars: int, messages: int, seconds: float) -> Budget:
        return cls(deadline=time.monotonic() + seconds, steps=100_000 + 100 * messages,
                   allocation=64_000_000 + 16 * input_chars, output=4_000_000 + 8 * input_chars,
                   sequence_cap=1_000_000 + 2 * input_chars)

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError("ran past its time limit")

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TemplateError("ran past its limit on loop steps")
        self.tick()

    def allocate(self, size: int) -> None:
        if size > self.sequence_cap:
            raise TemplateError(f"tried to build a value of {size:,} characters or items "
                                f"(the limit is {self.sequence_cap:,})")
        self.allocation -= size
        if self.allocation < 0:
            raise TemplateError("ran past its memory limit")
        self.tick()

    def emit(self, size: int) -> None:
        self.output -= size
        if self.output < 0:
            raise TemplateError("wrote output past its size limit")


# Outside a render (jinja2 folds constants at compile time) a generous budget applies, so folding a
# hostile constant fails and is left to the render, where the real budget refuses it.
_COMPILE_BUDGET = Budget(float("inf"), 10**9, 10**12, 10**12, 1_000_000)
_current: contextvars.ContextVar[Budget] = contextvars.ContextVar("template_budget", default=_COMPILE_BUDGET)


def budget() -> Budget:
    return _current.get()


def rendering_with(b: Budget) -> contextvars.Token:
    return _current.set(b)


def done_rendering(token: contextvars.Token) -> None:
    _current.reset(token)


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _check_int(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise TemplateError(f"computed an integer over {MAX_INT_BITS} bits")


def _check_width(value: Any, what: str) -> None:
    if isinstance(value, int) and abs(value) > WIDTH_CAP:
        raise TemplateError(f"asked for a {what} of {value:,} (the limit is {WIDTH_CAP:,})")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\d*)(?:\.(\d*))?")
_DIGITS = re.compile(r"\d+")


def _format_widths(fmt: str, percent: bool) -> list[str]:
    """The width and precision numbers in a %-format, or in the specs of a str.format string."""
    if percent:
        return [n for match in _PERCENT_SPEC.finditer(fmt) for n in match.groups() if n]
    try:
        specs = [spec or "" for _, _, spec, _ in string.Formatter().parse(fmt)]
    except ValueError:  # malformed: formatting it fails on its own
        return []
    return [n for spec in specs for n in _DIGITS.findall(spec)]


def _check_format(fmt: str, args: Iterable[Any], percent: bool = False) -> None:
    """Widths and precisions in a format string, and numbers that ``*`` or ``{}`` widths may take."""
    for run in _format_widths(fmt, percent):
        if len(run) > 6 or int(run) > WIDTH_CAP:
            raise TemplateError(f"has a format string that asks for a width of {run}")
    for arg in args:
        _check_width(arg, "format width")


def _power(base: Any, exp: Any) -> Any:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        if exp * base.bit_length() > MAX_INT_BITS + 1:
            raise TemplateError(f"computed a power over {MAX_INT_BITS} bits")
    return base**exp


def _times(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
            raise TemplateError(f"computed an integer over {MAX_INT_BITS} bits")
        return left * right
    seq, count = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(count, int) and _sized(seq):
        budget().allocate(len(seq) * max(count, 0))
    return left * right


def _plus(left: Any, right: Any) -> Any:
    if _sized(left) and _sized(right):
        budget().allocate(len(left) + len(right))
    result = left + right
    _check_int(result)
    return result


def _text_size(value: Any, limit: int) -> int:
    """About how long ``str(value)`` would be, found without building it; counting stops past ``limit``
    (a list holding one big list a million times prints as terabytes from a few megabytes of memory)."""
    size, stack = 0, [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, str):
            size += len(item) + 2  # repr quotes inside containers
        elif isinstance(item, (list, tuple, set, frozenset)):
            size += 2 + 2 * len(item)  # brackets, ", " separators
            stack.extend(item)
        elif isinstance(item, dict):
            size += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, int):
            size += item.bit_length() // 3 + 2
        else:
            size += 32  # floats, None, booleans, markup: short
    return size


def _stringify(value: Any) -> str:
    """``str(value)``, refused before it is built when it would pass the size cap."""
    if not isinstance(value, str):
        b = budget()
        b.allocate(_text_size(value, b.sequence_cap))
    return str(value)


def _modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        args = right if isinstance(right, tuple) else (right,)
        _check_format(left, args, percent=True)
        # Sized before it is built: ``'%s' * 2500 % ((s,) * 2500)`` built 2.67 GB before the check after it.
        b = budget()
        b.allocate(len(left) + sum(_text_size(a, b.sequence_cap) for a in args))
        result = left % right
        b.allocate(len(result))
        return result
    return left % right


@pass_environment
def _bounded_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """The ``sum`` filter one addition at a time, each sized and charged: the built-in copies lists
    quadratically inside one C call (``([[0]] * 1000000)|sum(start=[])`` ran for minutes)."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        budget().tick()
        total = _plus(total, item)
    return total


class BoundedRange:
    """``range`` for templates: one no longer than the step budget, each number a loop step."""

    def __init__(self, *args: int):
        self.numbers = range(*args)
        size = self.numbers.stop - self.numbers.start  # len() of a huge range overflows
        if abs(size) // max(abs(self.numbers.step), 1) > budget().steps:
            raise TemplateError(f"asked for a range() longer than the loop steps it has left ({budget().steps:,})")

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, index: Any) -> Any:
        return self.numbers[index]

    def __contains__(self, value: Any) -> bool:
        return value in self.numbers

    def __iter__(self) -> Iterator[int]:
        for n in self.numbers:
            budget().step()
            yield n


def _bounded_iter(iterable: Any) -> Iterator[Any]:
    """What every ``{% for %}`` runs over: each item is a loop step."""
    for item in iterable:
        budget().step()
        yield item


def _bounded_concat(*parts: Any) -> str:
    """``a ~ b``: sized before it is joined."""
    texts = [_stringify(p) for p in parts]
    budget().allocate(sum(map(len, texts)))
    return "".join(texts)


def _bounded_emit(value: Any) -> str:
    """Every ``{{ … }}`` and text block on its way out, in macros and ``set`` blocks too."""
    text = _stringify(value)
    budget().emit(len(text))
    return text


# String methods that can build much more than they are given, and how large the result would be.
def _str_method_size(text: str, name: str, args: tuple, kwargs: dict) -> int:
    values = list(args) + list(kwargs.values())
    if name in ("ljust", "rjust", "center", "zfill"):
        _check_width(values[0] if values else 0, "padding width")
        return len(text) + (values[0] if values and isinstance(values[0], int) else 0)
    if name == "expandtabs":
        size = values[0] if values and isinstance(values[0], int) else 8
        _check_width(size, "tab size")
        return len(text) + text.count("\t") * max(size, 0)
    if name == "replace" and len(values) >= 2 and isinstance(values[0], str) and isinstance(values[1], str):
        return len(text) + text.count(values[0]) * len(values[1])
    if name == "join" and values and isinstance(values[0], (list, tuple)):  # other iterables: charged after
        items = values[0]
        return sum(len(i) if isinstance(i, str) else 0 for i in items) + len(text) * max(len(items) - 1, 0)
    if name in ("format", "format_map"):
        mapping = values[0] if name == "format_map" and values and isinstance(values[0], dict) else {}
        _check_format(text, values + list(mapping.values()))
        return len(text)
    if name == "translate":
        raise TemplateError("called str.translate, which templates may not use")
    return 0


_WIDTH_FILTERS = {"center": "width", "indent": "width", "wordwrap": "width", "truncate": "length",
                  "batch": "linecount", "slice": "slices", "tojson": "indent", "urlize": "trim_url_limit"}


def bounded_filter(name: str, func: Callable) -> Callable:
    """A built-in filter that checks its size arguments first and charges what it builds."""
    passes = 1 if hasattr(func, "jinja_pass_arg") else 0

    @functools.wraps(func)  # keeps jinja's pass_context/pass_environment marker
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        b = budget()
        b.tick()
        value, *rest = args[passes:] or (None,)  # after jinja's context argument: the value, then options
        if name in _WIDTH_FILTERS:
            for option in rest + list(kwargs.values()):
                _check_width(option, f"{name} size")
        if isinstance(value, str):
            if name == "replace" and len(rest) >= 2 and isinstance(rest[0], str) and isinstance(rest[1], str):
                b.allocate(len(value) + value.count(rest[0]) * len(rest[1]))
            elif name == "indent":
                width = (rest or [kwargs.get("width", 4)])[0]
                b.allocate(len(value) + (value.count("\n") + 1) * (len(width) if isinstance(width, str) else width))
            elif name == "format":
                _check_format(value, rest, percent=True)
        elif name == "join" and isinstance(value, (list, tuple)):  # sized before it is built
            separator = rest[0] if rest and isinstance(rest[0], str) else kwargs.get("d", "")
            b.allocate(sum(_text_size(item, b.sequence_cap) for item in value)
                       + len(separator if isinstance(separator, str) else "") * max(len(value) - 1, 0))
        result = func(*args, **kwargs)
        if _sized(result):
            b.allocate(len(result))
        return result

    return wrapper


class _Bound(NodeTransformer):
    """Routes loops, ``~`` and output through the environment's counting hooks (by environment
    attribute, which a template cannot rebind)."""

    def _hook(self, name: str, args: list, lineno: int) -> nodes.Call:
        return nodes.Call(nodes.EnvironmentAttribute(name, lineno=lineno), args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = self._hook("hearth_iter", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return self._hook("hearth_concat", list(node.nodes), node.lineno)

    def visit_Output(self, node: nodes.Output) -> nodes.Output:
        self.generic_visit(node)
        node.nodes = [self._hook("hearth_emit", [child], child.lineno) for child in node.nodes]
        return node


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox chat templates render in; a render must run under :func:`rendering_with`."""

    intercepted_binops = frozenset(("**", "*", "+", "%"))

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.globals["range"] = BoundedRange
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: nothing a prompt needs
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters["sum"] = _bounded_sum
        # Stored once so ``call`` can recognise them by identity and skip its checks.
        self.hearth_iter, self.hearth_concat, self.hearth_emit = _bounded_iter, _bounded_concat, _bounded_emit
        self._hooks = (_bounded_iter, _bounded_concat, _bounded_emit)
        self._binops = {"**": _power, "*": _times, "+": _plus, "%": _modulo}

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateError(f"is {len(source):,} characters long (the limit is {MAX_SOURCE_CHARS:,})")
        tree = _Bound().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget().tick()
        return self._binops[operator](left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget().tick()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        if any(__obj is hook for hook in __self._hooks):
            return __obj(*args)  # kwargs are jinja's loop/block bookkeeping
        b = budget()
        b.tick()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format in a function
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str):
            size = _str_method_size(owner, getattr(method, "__name__", ""), args, kwargs)
            if size:
                b.allocate(size)
        b.depth += 1
        try:
            if b.depth > MAX_CALL_DEPTH:
                raise TemplateError(f"nested calls more than {MAX_CALL_DEPTH} deep (a recursive macro?)")
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            b.depth -= 1
        if _sized(result):
            b.allocate(len(result))
        return result
