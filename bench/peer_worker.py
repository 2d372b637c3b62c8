"""The llama.cpp side of bench/peer.py (not a test): runs in the peer venv, never in Hearth's.

    bench/.peer-venv/bin/python bench/peer_worker.py      # then one JSON request per line on stdin

Each request is ``{"op": ..., ...}`` and gets one JSON line back on stdout:
  load    model, n_ctx, threads, n_batch, flash_attn → load time, vocabulary, context, versions
  prefill tokens → seconds to evaluate them from an empty KV cache
  fill    tokens → the same, plus the last position's logits (float32, base64): a context to decode
          or save from, and a check that both engines read the same prompt
  decode  keep, first, steps, warmup → seconds for ``steps`` greedy steps after ``warmup``, started
          from ``first`` at ``keep`` tokens of context, and the ids picked; the KV cache is cut back
          to ``keep`` after
  extend  tokens → keep the KV's longest common prefix with them, evaluate the rest, pick a token: seconds,
          tokens evaluated (an agent's next request, bench/tool_loop.py)
  append  tokens → evaluate them after what the KV holds (a reply the other engine wrote, now in the cache)
  state   path → the whole state's bytes and ms to copy out / back in memory, to save / load a file
  quit
Token ids always come from the caller (Hearth's tokenizer), so both engines see the same prompt.
The worker imports only llama_cpp and numpy, so it runs in the peer venv.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import sys
import time
from typing import Any

import llama_cpp
import numpy as np


class Peer:
    def __init__(self, model: str, n_ctx: int, threads: int, n_batch: int, flash_attn: bool):
        start = time.perf_counter()
        # n_ubatch 512 and n_batch 2048 are llama-bench's defaults; verbose off keeps stderr quiet.
        self.llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512),
                                   n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn, verbose=False)
        self.load_s = time.perf_counter() - start
        self.n_vocab = self.llm.n_vocab()
        self.state_buf: ctypes.Array | None = None

    def info(self) -> dict[str, Any]:
        return {"load_s": self.load_s, "n_vocab": self.n_vocab, "n_ctx": self.llm.n_ctx(),
                "n_ctx_train": llama_cpp.llama_model_n_ctx_train(self.llm.model), "llama_cpp_python": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}

    def prefill(self, tokens: list[int]) -> float:
        self.llm.reset()  # the next eval drops every KV row first
        start = time.perf_counter()
        self.llm.eval(tokens)
        return time.perf_counter() - start

    def logits(self) -> np.ndarray:
        """The last position's logits (a view into llama.cpp's buffer)."""
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))

    def argmax(self) -> int:
        return int(np.argmax(self.logits()))

    def logits_b64(self) -> str:
        return base64.b64encode(self.logits().astype(np.float32).tobytes()).decode()

    def decode(self, keep: int, first: int, steps: int, warmup: int) -> dict[str, Any]:
        self.llm.n_tokens = keep  # eval removes the KV rows past n_tokens before it runs
        token, start, picked = first, time.perf_counter(), []
        for i in range(warmup + steps):
            if i == warmup:
                start = time.perf_counter()
            self.llm.eval([token])
            token = self.argmax()  # the same per-step work as Hearth's loop: logits → argmax
            picked.append(token)
        elapsed = time.perf_counter() - start
        self.llm.n_tokens = keep
        # leave exactly the context that was asked for (the next eval would cut it too)
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.llm.ctx), 0, keep, -1)
        return {"s": elapsed, "tokens": picked}

    def extend(self, tokens: list[int]) -> dict[str, Any]:
        """A prompt that may start with what the KV holds (an agent's next request): keep the longest common
        prefix, as llama.cpp's server does with its prompt cache, evaluate the rest and pick the first token.
        Seconds to that token, and how many tokens were evaluated."""
        held = self.llm.input_ids[:self.llm.n_tokens].tolist()
        keep = 0
        for a, b in zip(held, tokens[:-1], strict=False):  # at least the last token is evaluated: its logits
            if a != b:
                break
            keep += 1
        self.llm.n_tokens = keep  # eval removes the KV rows past n_tokens before it runs
        start = time.perf_counter()
        self.llm.eval(tokens[keep:])
        first = self.argmax()
        return {"s": time.perf_counter() - start, "evaluated": len(tokens) - keep, "first": first}

    def append(self, tokens: list[int]) -> dict[str, Any]:
        """Put a reply's tokens in the KV after what it holds, as decoding them would have (not timed: the reply
        another engine wrote, so the next request finds it cached as llama.cpp's server's slot would)."""
        start = time.perf_counter()
        self.llm.eval(tokens)
        return {"s": time.perf_counter() - start, "tokens": self.llm.n_tokens}

    def state(self, path: str) -> dict[str, Any]:
        ctx, n = self.llm.ctx, self.llm.n_tokens
        size = llama_cpp.llama_state_get_size(ctx)
        if self.state_buf is None or len(self.state_buf) < size:
            self.state_buf = (ctypes.c_uint8 * size)()  # allocated (and zero-filled) outside the timing
            ctypes.memset(self.state_buf, 1, size)
        out: dict[str, Any] = {"tokens": n, "state_bytes": size}
        t = time.perf_counter()
        copied = llama_cpp.llama_state_get_data(ctx, self.state_buf, size)
        out["get_data_ms"] = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        llama_cpp.llama_state_set_data(ctx, self.state_buf, copied)
        out["set_data_ms"] = (time.perf_counter() - t) * 1000

        tokens = (llama_cpp.llama_token * n)(*self.llm.input_ids[:n].tolist())
        if os.path.exists(path):
            os.remove(path)  # a new file each time, as Hearth's full save writes one
        t = time.perf_counter()
        if not llama_cpp.llama_state_save_file(ctx, path.encode(), tokens, n):
            raise RuntimeError(f"llama_state_save_file failed for {path}")
        out["save_file_ms"] = (time.perf_counter() - t) * 1000
        # Hearth's save fsyncs its file (and the folder); time the same for a like-for-like figure.
        t = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        out["fsync_ms"] = (time.perf_counter() - t) * 1000
        out["file_bytes"] = os.path.getsize(path)

        back = (llama_cpp.llama_token * self.llm.n_ctx())()
        count = ctypes.c_size_t(0)
        t = time.perf_counter()
        if not llama_cpp.llama_state_load_file(ctx, path.encode(), back, len(back), ctypes.byref(count)):
            raise RuntimeError(f"llama_state_load_file failed for {path}")
        out["load_file_ms"] = (time.perf_counter() - t) * 1000
        if count.value != n or list(back[:n]) != tokens[:]:
            raise RuntimeError(f"the state file gave back {count.value} tokens, not the {n} saved")
        self.llm.n_tokens = n
        return out


def main() -> int:
    # Only our JSON may reach the caller: keep the real stdout for it and point fd 1 (where C code
    # might print) at stderr.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    peer: Peer | None = None
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            if op == "quit":
                break
            if op == "load":
                peer = Peer(**req)
                result: Any = peer.info()
            elif peer is None:
                raise RuntimeError("load a model first")
            elif op == "prefill":
                result = {"s": peer.prefill(req["tokens"])}
            elif op == "fill":
                result = {"s": peer.prefill(req["tokens"]), "last_logits": peer.logits_b64()}
            elif op == "decode":
                result = peer.decode(**req)
            elif op == "append":
                result = peer.append(**req)
            elif op == "extend":
                result = peer.extend(**req)
            elif op == "state":
                result = peer.state(**req)
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # report to the caller, who stops the run with the reason
            result = {"error": f"{type(exc).__name__}: {exc}"}
        reply.write(json.dumps(result) + "\n")
        reply.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
