"""GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``): every byte has a printable stand-in
character in the vocabulary, and a pre-tokenizer regex (named by ``tokenizer.ggml.pre``) splits the
text into words before the merges run.
"""

from __future__ import annotations

from functools import lru_cache

from engine.errors import UnsupportedModelError

# GPT-2's split pattern; most byte-level llama tokenizers use it or a close variant.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# Llama 3: case-insensitive contractions, a letter run may take one leading non-letter, numbers in
# groups of up to three, newlines kept with the punctuation before them.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2: as Llama 3, but every digit is its own word.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# name in tokenizer.ggml.pre → (split digits one by one first, split regex); llama.cpp's names
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "refact": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}


@lru_cache(maxsize=1)
def byte_to_char() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@lru_cache(maxsize=1)
def char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_char().items()}


def token_text_to_bytes(token: str) -> bytes | None:
    """The bytes a byte-level token stands for, or None if it is not made of byte stand-ins."""
    table = char_to_byte()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return None


def build(tokens: list[str], merges: list[str], pre: str):
    """A ``tokenizers.Tokenizer`` for the vocabulary (added tokens are the caller's business)."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    split_digits, pattern = PRE_TOKENIZERS[pre]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    steps += [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
    hf.decoder = decoders.ByteLevel()
    return hf
