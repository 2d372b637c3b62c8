"""What a GGUF is as a text model, from its metadata alone (no tokenizer is built): for ``model info``."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from engine.model.gguf_file import GGUFModel
from engine.text.builtin_templates import choose_family, template_source
from engine.text.tokenizer import special_ids

# Words in general.finetune / general.name that say how the weights were trained.
_CHAT_WORDS = {"instruct", "it", "chat", "sft", "dpo", "rlhf", "assistant"}
_BASE_WORDS = {"base", "pt", "pretrained"}


@dataclass(frozen=True)
class TextProfile:
    tokenizer: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    vocab_size: int
    chat_template_source: str | None  # "gguf", "builtin:<family>", or None (cannot chat)
    kind: str  # "chat" (instruction-tuned) or "base" (continues text)
    stop_tokens: tuple[str, ...]

    def as_dict(self) -> dict:
        return {**asdict(self), "stop_tokens": list(self.stop_tokens)}


def model_kind(gguf: GGUFModel) -> str:
    """"chat" or "base": the metadata's name/finetune words first, else whether the file has a template."""
    text = " ".join(str(gguf.value(k, "") or "") for k in ("general.finetune", "general.name")).lower()
    words = set(re.split(r"[^a-z0-9]+", text))
    if words & _CHAT_WORDS:
        return "chat"
    if words & _BASE_WORDS:
        return "base"
    return "chat" if gguf.value("tokenizer.chat_template") else "base"


def describe(gguf: GGUFModel) -> TextProfile:
    tokens = gguf.string_array("tokenizer.ggml.tokens")
    vocab = set(tokens)

    def token_id(key: str) -> int | None:
        value = gguf.value(key)
        return int(value) if value is not None and 0 <= int(value) < len(tokens) else None

    specials = special_ids(tokens, *(token_id(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot")))
    stop = {tokens[i] for i in specials.stop}
    source = template_source(gguf, vocab)
    if source and source.startswith("builtin:"):
        family = choose_family(str(gguf.value("general.architecture", "")), vocab)
        stop.add(family.end_of_turn)
    return TextProfile(str(gguf.value("tokenizer.ggml.model", "")), len(tokens), source, model_kind(gguf),
                       tuple(sorted(stop)))
