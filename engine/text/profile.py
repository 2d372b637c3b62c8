"""What a GGUF is as a text model, from its metadata alone (no tokenizer is built): for ``model info``."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from engine.model.gguf_file import GGUFModel
from engine.text.builtin_templates import choose_template
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
    chat_template_refused: str = ""  # why the file's own template was set aside for a built-in one, or ""

    def as_dict(self) -> dict:
        fields = {k: v for k, v in asdict(self).items() if k != "chat_template_refused"}  # model info has it on top
        return {**fields, "stop_tokens": list(self.stop_tokens)}

    @property
    def template_label(self) -> str:
        """The template source as ``model info`` prints it, with why the file's own was refused."""
        source = self.chat_template_source or "none (cannot chat)"
        return f"{source} (the file's template was refused: {self.chat_template_refused})" if self.chat_template_refused \
            else source


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
    bos, eos = (tokens[i] if i is not None else "" for i in (specials.bos, specials.eos))
    choice = choose_template(gguf, vocab, bos, eos)
    if choice.family is not None:
        stop.add(choice.family.end_of_turn)
    return TextProfile(str(gguf.value("tokenizer.ggml.model", "")), len(tokens), choice.source, model_kind(gguf),
                       tuple(sorted(stop)), choice.refused)
