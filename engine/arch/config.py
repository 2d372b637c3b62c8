"""What the runtime and the checkpoints need to know about a model, whatever its architecture."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """A decoder's shape, read from GGUF metadata by its architecture's module (engine/arch/), stored
    in the converted model as ``hearth.config`` and read back from there by the runner."""

    architecture: str  # GGUF general.architecture, e.g. "llama"
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    context_length: int
    vocab_size: int
    norm_eps: float
    rope_dim: int  # dimensions of each head that rotate
    rope_base: float
    rope_scale: float  # linear position scaling; 1.0 when the model has none
    tied_embeddings: bool  # the output head is the token embedding table
    # What only some architectures have (say a sliding window), as JSON values, so the runner can read
    # them back without knowing the architecture.
    extras: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """Raises ValueError (or TypeError) for anything that is not a config this code wrote."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the model config is not a JSON object")
        return cls(**data)
