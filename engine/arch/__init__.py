"""Model architectures: which GGUF ``general.architecture`` values Hearth runs, and the module for each.

An architecture's module (``engine/arch/<name>.py``) provides:

* ``NAME``: its ``general.architecture`` value;
* ``GRAPH_VERSION``: an int, bumped whenever the graph it builds changes (it is part of the model
  fingerprint, so conversions and saved contexts made by the older graph stop matching);
* ``read_config(model: GGUFModel) -> ModelConfig``: its hyperparameters from the GGUF metadata,
  refusing with UnsupportedModelError what the graph cannot compute;
* ``build(g: engine.arch.blocks.Graph) -> None``: its graph, from the shared blocks;
* optionally ``FP16_ACTIVATIONS = False`` when its activations exceed fp16's range and its graph cannot keep
  them inside it: then fp16-compute precisions are refused and CUDA, whose attention is fp16 only, is not used.
  (Gemma 3's residual stream passes fp16's range, and its graph keeps the stream scaled instead: gemma3.py.)

Modules are imported on first use: the runtime reads ``ModelConfig`` and the graph's I/O names from
this package without paying for the graph builder.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from engine.arch.config import ModelConfig
from engine.errors import UnsupportedModelError

if TYPE_CHECKING:
    from engine.arch.blocks import Graph
    from engine.model.gguf_file import GGUFModel

__all__ = ["Architecture", "ModelConfig", "architecture_for", "architecture_modules", "fp16_activations_ok",
           "get_architecture", "supported_architectures"]

# general.architecture → the module that builds it. Register a new architecture here.
_MODULES = {
    "llama": "engine.arch.llama",
    "qwen2": "engine.arch.qwen2",
    "qwen3": "engine.arch.qwen3",
    "gemma3": "engine.arch.gemma3",
    "phi3": "engine.arch.phi3",
}


class Architecture(Protocol):
    NAME: str
    GRAPH_VERSION: int

    def read_config(self, model: GGUFModel) -> ModelConfig: ...

    def build(self, g: Graph) -> None: ...


def fp16_activations_ok(arch: Architecture) -> bool:
    return bool(getattr(arch, "FP16_ACTIVATIONS", True))


def supported_architectures() -> tuple[str, ...]:
    return tuple(_MODULES)


def architecture_modules() -> tuple[str, ...]:
    """The modules imported by name (for a bundler, which cannot follow an import by name)."""
    return tuple(_MODULES.values())


def get_architecture(name: str, where: str = "") -> Architecture:
    """The module for ``name``; UnsupportedModelError naming the ones Hearth runs for any other."""
    if name not in _MODULES:
        prefix = f"{where}: " if where else ""
        raise UnsupportedModelError(
            f"{prefix}architecture {name!r} is not supported; Hearth runs {', '.join(_MODULES)} models")
    return importlib.import_module(_MODULES[name])  # type: ignore[return-value]


def architecture_for(model: GGUFModel) -> Architecture:
    """The module for a GGUF's ``general.architecture``."""
    name = model.require("general.architecture")
    return get_architecture(str(name), model.path.name)


def model_config(model: GGUFModel) -> ModelConfig:
    """The model's config, read by its architecture's module (UnsupportedModelError if none). Here, not on
    GGUFModel: the file reader sits below the architectures and never calls up into them."""
    return architecture_for(model).read_config(model)
