"""What the window was started with: where data lives and which model runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.api import DEFAULT_PRECISION, HearthPaths, resolve_paths


@dataclass(frozen=True)
class AppConfig:
    paths: HearthPaths
    model: str | None = None  # a GGUF path; None: the default model
    weights: str = DEFAULT_PRECISION
    provider: str = "auto"

    @classmethod
    def from_args(cls, data_dir: str | None, model: str | None, weights: str, provider: str) -> AppConfig:
        return cls(resolve_paths(data_dir).ensure(), model, weights, provider)

    @property
    def settings_file(self) -> Path:
        """Window geometry, splitter sizes and the last open chat (an INI file next to the data)."""
        return self.paths.data / "window.ini"
