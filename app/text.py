"""Small wordings the window shows: ages, counts, how a turn started and ended, the model."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping

from engine.api import reply_caption
from engine.types import ChatTokens, Finished, LibraryModel, ModelInfo, Rebuilt, ReplyFacts, Resume, ResumeSource

# What a one-line label must not draw raw: C0 controls (tab and newline too), DEL, C1 controls, the bidi
# marks, embeddings, overrides and isolates, and the line and paragraph separators.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def display_safe(text: str) -> str:
    """Text from a model file or the database as a label shows it: each control or bidi character written
    as a visible escape ("\\x1b", "\\u202e"). A GGUF's general.name is anyone's: an ESC or a U+202E drawn
    raw shows as garbage or reverses what follows it (a name that reads as another model's)."""
    return _UNSAFE.sub(_escaped, text)


def display_safe_lines(text: str) -> str:
    """``display_safe`` for text of several lines (a tool's description, a server's error output): its line
    breaks and tabs kept as such, every other control or bidi character escaped."""
    lines = text.replace("\r\n", "\n").expandtabs(4).split("\n")
    return "\n".join(display_safe(line) for line in lines)


def shown_model(model: LibraryModel) -> LibraryModel:
    """A library entry with the texts its file gave (name, description, licence) made display-safe; the
    key and the path stay exact, as the library needs them."""
    return dataclasses.replace(model, title=display_safe(model.title), description=display_safe(model.description),
                               license=display_safe(model.license))


def count(n: int) -> str:
    return f"{n:,}"


def age(ms: int, now_ms: int | None = None) -> str:
    """'just now', '5 min ago', '3 h ago', 'yesterday', '12 Mar'."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    seconds = max(0, (now_ms - ms) // 1000)
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    if seconds < 2 * 86400:
        return "yesterday"
    return time.strftime("%d %b %Y" if seconds > 300 * 86400 else "%d %b", time.localtime(ms / 1000))


def duration(ms: float) -> str:
    """'850 ms', '1.0 s', '59.9 s', '2 min 5 s', '1 h 3 min': rounded first, so 999.7 ms is '1.0 s'."""
    if round(ms) < 1000:
        return f"{max(0, round(ms))} ms"
    if round(ms / 1000, 1) < 60:
        return f"{ms / 1000:.1f} s"
    seconds = round(ms / 1000)
    if seconds < 3600:
        minutes, rest = divmod(seconds, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(seconds // 60, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def resume_summary(resume: Resume) -> str:
    """How a turn started, e.g. 'resumed 1,843 tokens from disk in 41 ms · re-reading would take ≈ 19 s'."""
    source, reused, prefilled = resume.source, resume.reused_tokens, resume.prefilled_tokens
    if source == ResumeSource.DISK and resume.shared_prefix:  # a new chat: only the system prompt was on disk
        text = f"the system prompt's {count(resume.restored_tokens or reused)} tokens came from disk"
    elif source == ResumeSource.DISK:
        text = f"resumed {count(resume.restored_tokens or reused)} tokens from disk in {duration(resume.restore_ms)}"
        if resume.prefill_estimate_ms:
            text += f" · re-reading would take ≈ {duration(resume.prefill_estimate_ms)}"
    elif source == ResumeSource.LIVE:
        text = f"continued from memory ({count(reused)} tokens kept)"
    elif source == ResumeSource.REBUILT:
        text = f"rebuilt: {resume.plain or resume.reason}"
    else:
        return f"read {count(prefilled)} tokens from scratch" if prefilled else "started from scratch"
    if prefilled:
        text += f" · read {count(prefilled)} new tokens"
    return text


def reply_notes(facts: Mapping[int, ReplyFacts]) -> dict[int, str]:
    """seq → the caption under each stored reply (``ConversationStore.reply_facts``), for the chat pane and
    the browser's preview alike."""
    return {seq: display_safe(reply_caption(f.finish, f.model)) for seq, f in facts.items()}


def turn_note(finished: Finished) -> str:
    """The note beside a reply that just finished: its caption (``reply_caption``), and a failed save."""
    caption = display_safe(reply_caption(str(finished.stop_reason), finished.model.label))
    parts = [caption] if caption else []
    save = finished.local.save if finished.local is not None else None  # a remote backend saves nothing here
    if save is not None and not save.ok:
        parts.append(f"context not saved: {save.error or 'unknown error'}")
    return " · ".join(parts)


def server_cache_note(finished: Finished) -> str:
    """What a remote server said of its prefix cache for the turn: "the server had 5,129 of 5,180 tokens
    cached", or that it did not say."""
    cached = finished.server_cached_tokens
    if cached is None:
        return "cached tokens not reported"
    return f"the server had {count(cached)} of {count(finished.prompt_tokens)} tokens cached"


def server_name(info: ModelInfo) -> str:
    """The server a remote model runs on, as its key names it (NAME/MODEL), else its provider as given."""
    name, sep, _model = (info.key or "").partition("/")
    return name if sep and name and info.provider in ("", "remote") else info.provider


def model_label(info: ModelInfo) -> str:
    base = " · base model" if info.kind == "base" else ""
    local = info.local is not None or info.provider in ("cpu", "cuda")  # a remote backend names its own provider
    where = ("CUDA" if info.provider == "cuda" else "CPU") if local else display_safe(server_name(info))
    weights = f" · {info.weights}" if info.weights else ""  # a remote server may not say its precision
    return f"{display_safe(info.name)}{base}{weights} · {where}"


def model_tooltip(info: ModelInfo) -> str:
    """Why it runs where it runs, and what a user of a base model or a built-in template should know."""
    lines = [info.note] if info.note else []
    if info.kind == "base":
        lines.append("A base model: it continues text rather than following instructions, so replies may ramble.")
    if info.chat_template.startswith("builtin:"):
        family = info.chat_template.split(":", 1)[1]
        if info.chat_template_refused:
            lines.append(f"The model file's chat template was refused ({info.chat_template_refused}); "
                         f"Hearth uses its built-in {family} format.")
        else:
            lines.append(f"The model file has no chat format; Hearth uses its built-in {family} format.")
    return "\n".join(lines)


def context_label(used: int, limit: int) -> str:
    """'Context 1,843 / 8,192'; without the limit when the backend does not tell it (0)."""
    return f"Context {count(used)} / {count(limit)}" if limit else f"Context {count(used)}"


def byte_size(n: int) -> str:
    """'812 KB', '88.0 MB', '4.58 GB' (decimal units, as file managers and download pages show them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GB" else f"{n / scale:.1f} {unit}" if n < 100 * scale \
                else f"{n / scale:.0f} {unit}"
    return f"{n} B"


def quant_label(mix: object) -> str:
    """A model's quantization: a label as the catalog gives it, or the most common tensor types of the file."""
    if isinstance(mix, str):
        return mix or "—"
    if isinstance(mix, dict) and mix:
        quantized = {k: v for k, v in mix.items() if k not in ("F32", "F16", "BF16")} or mix  # norms are F32
        top = sorted(quantized.items(), key=lambda kv: -kv[1])[:2]
        return " + ".join(name for name, _ in top)
    return "—"


def sentence(text: str) -> str:
    """A message as a sentence: its first letter capitalised (engine errors start in lowercase)."""
    text = text.strip()
    first = text.split(" ", 1)[0]
    if not first.isalpha():  # a file name, a path, a number: as it is spelt
        return text
    return text[:1].upper() + text[1:]


def rebuilding_note(plain_reason: str) -> str:
    """The status bar while an opening rebuilds the context (the banner says the same, at the same moment)."""
    return f"Rebuilding the context: {plain_reason}" if plain_reason else "Rebuilding the context…"


def rebuilt_note(rebuilt: Rebuilt) -> str:
    """The status bar once the rebuild ended, in the banner's numbers and wording."""
    if rebuilt.cancelled:
        return f"Rebuild stopped after {duration(rebuilt.elapsed_ms)}"
    text = f"Rebuilt {count(rebuilt.tokens)} tokens in {duration(rebuilt.elapsed_ms)}"
    return text if rebuilt.save is not None and rebuilt.save.ok else f"{text} · not saved"


def version_chosen_note(index: int, counted: ChatTokens | None = None) -> str:
    """The status bar after ‹ ›: which version the chat continues with and, once its tokens are counted,
    how much of its context the next message reads again (the context was written with the other version)."""
    text = f"The chat continues with version {index + 1} of this reply"
    if counted is None:
        return text
    if counted.to_reread is None:  # not in memory: the saved context holds the other version
        return text + " · the next message re-reads the context from where the versions differ"
    if counted.to_reread > 0:
        return text + f" · the next message re-reads the last {count(counted.to_reread)} tokens of the context"
    return text


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 conversation', '2 conversations', '1,024 matches' (``many``: the plural when not word + 's')."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


# A GGUF's quantization at the end of its file name: "-Q4_K_M", ".Q4_1", "-IQ4_XS", "-F16", "-bf16".
_QUANT_SUFFIX = re.compile(r"[-._](?:I?Q\d\w*|B?F(?:16|32))$", re.IGNORECASE)


def short_model_label(info: ModelInfo) -> str:
    """The model label without the file name's quantization (the precision that runs follows it anyway):
    what the status bar shows when the whole label does not fit."""
    name = _QUANT_SUFFIX.sub("", info.name) or info.name
    return model_label(dataclasses.replace(info, name=name))
