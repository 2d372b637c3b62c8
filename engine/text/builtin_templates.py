"""Chat formats Hearth knows, for GGUFs that carry no chat template of their own.

The family is chosen from the vocabulary (a format is only usable if its marker tokens exist) and,
when several fit, from the architecture. The templates are Jinja, rendered in the same sandbox as a
file's own template, so both paths produce text the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from engine.errors import PromptError
from engine.model.gguf_file import GGUFModel
from engine.text.chat_template import ChatTemplate
from engine.text.template_check import template_problem
from engine.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Gemma has no system role: a leading system message opens the first user turn, and the assistant
# is called "model". Any later system message is shown to the model as a user turn.
_GEMMA = (
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set ns = namespace(system=messages[0]['content'] + '\\n\\n') -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set ns = namespace(system='') -%}{%- set turns = messages -%}{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for m in turns -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if role == 'user' -%}{{- ns.system -}}{%- set ns.system = '' -%}{%- endif -%}"
    "{{- m['content'] + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
_CHATML = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
_LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class Family:
    name: str
    source: str
    markers: tuple[str, ...]  # tokens the format is spelled with; the vocabulary must have them all
    end_of_turn: str
    architectures: tuple[str, ...]  # architectures (prefixes) that use this format


FAMILIES = (
    Family("gemma", _GEMMA, ("<start_of_turn>", "<end_of_turn>"), "<end_of_turn>", ("gemma",)),
    Family("llama3", _LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>", ("llama",)),
    Family("chatml", _CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>", ("qwen", "smollm")),
)


def choose_family(architecture: str, vocabulary: Collection[str]) -> Family | None:
    """The format for a model without a template: one whose markers the vocabulary has, the
    architecture's own first; None when no format fits."""
    usable = [f for f in FAMILIES if all(m in vocabulary for m in f.markers)]
    for family in usable:
        if architecture.startswith(family.architectures):
            return family
    return usable[0] if usable else None


@dataclass(frozen=True)
class TemplateChoice:
    """The chat format a model gets: the file's own template if it passes its trial render, else a
    built-in family's; ``refused`` says why the file's template was set aside ("" if it was not)."""

    source: str | None  # "gguf", "builtin:<family>", or None (no usable format)
    family: Family | None
    refused: str = ""


def choose_template(gguf: GGUFModel, vocabulary: Collection[str], bos: str, eos: str) -> TemplateChoice:
    own = gguf.value("tokenizer.chat_template")
    refused = template_problem(str(own), bos, eos) if own else ""
    if own and not refused:
        return TemplateChoice("gguf", None)
    if refused:
        log.warning("%s: its chat template was refused (%s); trying a built-in format", gguf.path.name, refused)
    family = choose_family(str(gguf.value("general.architecture", "")), vocabulary)
    return TemplateChoice(f"builtin:{family.name}" if family else None, family, refused)


def template_for(gguf: GGUFModel, tokenizer: Tokenizer) -> ChatTemplate | None:
    """The GGUF's own chat template, else the built-in one for its family, else None (a PromptError
    when the file's template was refused and no built-in format fits)."""

    def text(i: int | None) -> str:
        return tokenizer.tokens[i] if i is not None else ""

    bos, eos = text(tokenizer.specials.bos), text(tokenizer.specials.eos)
    choice = choose_template(gguf, set(tokenizer.tokens), bos, eos)
    if choice.source == "gguf":
        return ChatTemplate(str(gguf.value("tokenizer.chat_template")), bos, eos,
                            name=f"the chat template in {gguf.path.name}")
    if choice.family is None:
        if choice.refused:
            raise PromptError(f"the chat template in {gguf.path.name} was refused ({choice.refused}), and its "
                              f"vocabulary fits none of Hearth's built-in formats ({', '.join(f.name for f in FAMILIES)})")
        return None
    family = choice.family
    return ChatTemplate(family.source, bos, eos, choice.source, family.end_of_turn,
                        name=f"the built-in {family.name} chat template", refused=choice.refused)


def stop_ids(tokenizer: Tokenizer, template: ChatTemplate) -> frozenset[int]:
    """Ids that end a reply: the GGUF's EOS and EOT, known turn ends, and the built-in format's turn end."""
    end = tokenizer.token_id(template.end_of_turn) if template.end_of_turn else None
    return tokenizer.specials.stop | ({end} if end is not None else set())
