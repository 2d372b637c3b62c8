"""Test helpers for tokenizers: a small SentencePiece GGUF vocabulary written with the gguf writer, and
a plain reference of llama.cpp's SentencePiece rule (join the best-scoring pair, repeat) to compare with."""

from __future__ import annotations

from pathlib import Path

import numpy as np

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPM_CHARS = list("▁helowrdanipsty")
# joined pieces and their scores: "he" outranks "▁h", so "▁hel" is ▁ he l, not ▁h e l
SPM_PIECES = {"ll": -1.0, "he": -2.0, "▁h": -3.0, "llo": -4.0, "hello": -5.0, "▁hello": -6.0, "an": -7.0,
              "and": -8.0, "or": -9.0, "▁w": -10.0, "▁wor": -11.0, "ld": -12.0, "▁world": -13.0, "is": -14.0}
SPM_SPECIALS = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("<start_of_turn>", CONTROL),
                ("<end_of_turn>", CONTROL), ("\n", USER_DEFINED)]


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """ids 0-5 the specials above, 6-261 the bytes <0x00>..<0xFF>, then the characters and pieces."""
    tokens = [t for t, _ in SPM_SPECIALS] + [f"<0x{b:02X}>" for b in range(256)]
    types = [k for _, k in SPM_SPECIALS] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for i, ch in enumerate(SPM_CHARS):
        tokens.append(ch)
        types.append(NORMAL)
        scores.append(-100.0 - i)
    for piece, score in SPM_PIECES.items():
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(score)
    return tokens, scores, types


def write_spm_gguf(path: Path, *, add_space_prefix: bool = True, architecture: str = "gemma3",
                   template: str | None = None, eot: str | None = None) -> Path:
    """A GGUF holding only metadata: a SentencePiece vocabulary (no tensors are needed to tokenize)."""
    import gguf

    tokens, scores, types = spm_vocabulary()
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("</s>"))
    writer.add_unk_token_id(0)
    if eot is not None:
        writer.add_eot_token_id(tokens.index(eot))
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_spm(tokens: list[str], types: list[int], scores: list[float], text: str, add_space_prefix: bool) -> list[int]:
    """llama.cpp's SentencePiece tokenization, written plainly (quadratic; for short test strings)."""
    ids: dict[str, int] = {}
    for i, t in enumerate(tokens):
        ids.setdefault(t, i)
    normal = {t: i for i, t in enumerate(tokens) if types[i] == NORMAL}
    matched = sorted((t for i, t in enumerate(tokens) if types[i] in (CONTROL, USER_DEFINED)), key=len, reverse=True)
    out: list[int] = []

    def pieces(raw: str) -> None:
        symbols = list(((" " if add_space_prefix else "") + raw).replace(" ", "▁"))
        while True:
            best = None
            for j in range(len(symbols) - 1):
                joined = symbols[j] + symbols[j + 1]
                if joined in normal and (best is None or scores[normal[joined]] > best[0]):
                    best = (scores[normal[joined]], j)
            if best is None:
                break
            j = best[1]
            symbols[j:j + 2] = [symbols[j] + symbols[j + 1]]
        for s in symbols:
            out.extend([normal[s]] if s in normal else [ids[f"<0x{b:02X}>"] for b in s.encode("utf-8")])

    raw, i = "", 0
    while i < len(text):
        special = next((t for t in matched if text.startswith(t, i)), None)
        if special is None:
            raw += text[i]
            i += 1
            continue
        if raw:
            pieces(raw)
            raw = ""
        out.append(ids[special])
        i += len(special)
    if raw:
        pieces(raw)
    return out


def gguf_vocabulary(gguf_model) -> tuple[list[str], list[int], list[float]]:
    tokens = gguf_model.string_array("tokenizer.ggml.tokens")
    types = gguf_model.int_array("tokenizer.ggml.token_type").tolist()
    scores = np.asarray(gguf_model.value("tokenizer.ggml.scores"), dtype=np.float32).tolist()
    return tokens, types, scores


def write_bare_gguf(path: Path, chat_template: str | None = None) -> Path:
    """A llama-tokenizer GGUF whose vocabulary spells no chat format's markers (nothing to fall back to)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "▁", "a"])
    writer.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0])
    writer.add_token_types([2, 3, 3, 1, 1])
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    return path
