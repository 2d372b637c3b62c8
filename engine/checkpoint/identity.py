"""What a checkpoint must match: fingerprints of the model and of the tokenizer + chat template."""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.arch.config import ModelConfig
from engine.checkpoint.format import Identity, KVShape
from engine.generation import Engine
from engine.text.chat_template import ChatTemplate
from engine.text.tokenizer import Tokenizer


def build_identity(model_key: str, label: str, tokenizer: Tokenizer, template: ChatTemplate,
                   config: ModelConfig, kv_dtype: str = "float32") -> Identity:
    """The model fingerprint covers the GGUF's hash, the precision, the converter version and the
    architecture's graph version (so the weights and the graph); the tokenizer fingerprint covers the
    vocabulary, merges, pre-tokenizer, special ids and the chat template, which together decide the
    ids a conversation becomes."""
    tok = hashlib.sha256(tokenizer.fingerprint)
    for part in (template.source, template.bos_token, template.eos_token):
        tok.update(b"\xff" + part.encode("utf-8"))
    shape = KVShape(config.n_layers, config.n_head_kv, config.head_dim, config.context_length, kv_dtype)
    return Identity(hashlib.sha256(model_key.encode()).digest(), tok.digest(), shape, label)


def engine_identity(engine: Engine) -> Identity:
    if engine.model is not None:
        key, label = engine.model.fingerprint, f"{engine.model.gguf_path.stem} {engine.model.precision}"
    else:  # an engine built by hand from an ONNX file: its path is the best identity there is
        key, label = str(engine.runner.path.resolve()), engine.runner.path.stem
    return build_identity(key, label, engine.tokenizer, engine.template, engine.runner.config,
                          engine.runner.kv_dtype.name)


def gguf_identity(gguf_path: Path, precision: str) -> tuple[Identity, int]:
    """(The identity an engine on this GGUF and precision would have, its vocabulary size), without
    loading ONNX Runtime."""
    from engine.arch import architecture_for
    from engine.model.convert import gguf_digest, model_fingerprint
    from engine.model.gguf_file import GGUFModel
    from engine.model.precision import get_precision

    gguf = GGUFModel(gguf_path)
    tokenizer = Tokenizer.from_gguf(gguf)
    template = Engine.template_for(gguf, tokenizer)
    arch = architecture_for(gguf)
    prec = get_precision(precision)
    key = model_fingerprint(gguf_digest(gguf_path), prec.weights_id, arch.NAME, arch.GRAPH_VERSION)
    identity = build_identity(key, f"{Path(gguf_path).stem} {precision}", tokenizer, template, arch.read_config(gguf),
                              prec.compute)
    return identity, tokenizer.vocab_size
