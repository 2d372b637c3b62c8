"""The import rules, checked on every import parsed from the source (function-level ones too; see import_graph.py):
no cycles in engine/ and app/; front ends (the window, the server, the CLI) reach the engine only through its
public face; nothing below a front end imports one."""

from __future__ import annotations

import pytest

from .import_graph import cycles, import_graph

FRONT_ENDS = ("app", "engine.cli", "engine.server")
# what a front end may import from the engine: the façade, its records and errors, the backends package (and its
# subpackages). ``engine`` itself is only the version string and a telemetry opt-out, imported before any of these.
PUBLIC = ("engine.api", "engine.types", "engine.errors", "engine.backends")
ROOT = "engine"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def front_end_of(name: str) -> str | None:
    return next((f for f in FRONT_ENDS if _within(name, f)), None)


def is_public(name: str) -> bool:
    return name == ROOT or any(_within(name, p) for p in PUBLIC)


def reaching_past_the_face(graph: dict[str, set[str]]) -> list[str]:
    """Imports by a front end of an engine module that is neither public nor a front end's."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if front_end_of(m)
                  for t in targets if _within(t, ROOT) and not front_end_of(t) and not is_public(t))


def importing_a_front_end(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a front end by a module that is not one."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if not front_end_of(m) for t in targets if front_end_of(t))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_the_code_base(graph):
    """The rules below cannot pass vacuously: the parser finds the modules and the imports front ends make."""
    assert len(graph) > 100
    for front_end in FRONT_ENDS:
        assert any("engine.api" in graph[m] for m in graph if _within(m, front_end)), front_end
    assert any(_within(t, "engine.session") for t in graph["engine.backends.local"])  # the local backend runs it


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_front_ends_reach_the_engine_only_through_its_public_face(graph):
    """A front end imports engine.api / types / errors / backends, its own package, or another front end's
    (the window starts the embedded server and the terminal chat, the CLI starts the server)."""
    assert reaching_past_the_face(graph) == []


def test_nothing_but_a_front_end_imports_a_front_end(graph):
    """The API (and everything under it) never imports the server, the terminal chat or the CLI."""
    assert importing_a_front_end(graph) == []


def test_the_checks_catch_what_they_forbid(graph):
    """Each rule fails on one planted import of the kind it forbids."""
    looped = {**graph, "engine.types": graph["engine.types"] | {"engine.api"}}
    assert any({"engine.api", "engine.types"} <= set(c) for c in cycles(looped))
    deep = {**graph, "engine.cli.main": graph["engine.cli.main"] | {"engine.checkpoint.store"}}
    assert "engine.cli.main -> engine.checkpoint.store" in reaching_past_the_face(deep)
    upward = {**graph, "engine.api": graph["engine.api"] | {"engine.server.embedded"}}
    assert "engine.api -> engine.server.embedded" in importing_a_front_end(upward)


def test_the_gguf_reader_sits_below_the_architectures(graph):
    """Reading a GGUF (engine/model's reader and its quant tables) imports no architecture, runtime or
    conversion: the architectures build on it, and conversion and memory planning on both."""
    reader = ("engine.model.gguf_parse", "engine.model.gguf_file", "engine.model.quant", "engine.model.precision")
    above = ("engine.arch", "engine.runtime", "engine.model.convert", "engine.model.facts", "engine.model.footprint",
             "engine.model.memory")
    offenders = sorted(f"{m} -> {t}" for m in reader for t in graph[m] if any(_within(t, a) for a in above))
    assert offenders == []
