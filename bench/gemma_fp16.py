"""Gemma 3's fp16 forms against its int4 model (not a test; issue 34): the prompt's last logits and a greedy reply,
on ONNX Runtime's fp16 CPU kernels (the ops CUDA runs), with the residual stream scaled as the graph keeps it.

    python bench/gemma_fp16.py [--model .test-cache/home/models/gemma-3-270m-q4_k_m.gguf] [--tokens 24]

Prints, per fp16 form and prompt, the largest logit difference against int4, the largest |logit|, whether any
logit is NaN, and whether the greedy replies are the same.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.generation import Engine  # noqa: E402
from engine.model.convert import ensure_converted  # noqa: E402
from engine.model.gguf_file import GGUFModel  # noqa: E402
from engine.runtime.runner import ModelRunner  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.text.tokenizer import Tokenizer  # noqa: E402

PROMPTS = ["The lighthouse keeper climbed the stairs at dusk and lit the lamp. Tell me what happened next, in detail.",
           "Name three colours of the rainbow.", "def fibonacci(n):\n    "]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / ".test-cache" / "home" / "models" / "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--forms", default="int4-cuda-dense,int4-half")
    args = ap.parse_args()
    gguf = Path(args.model)
    model = GGUFModel(gguf)
    tokenizer = Tokenizer.from_gguf(model)
    template = Engine.template_for(model, tokenizer)
    with tempfile.TemporaryDirectory(prefix="hearth-gemma-fp16-") as tmp:
        def engine(precision: str) -> Engine:
            converted = ensure_converted(gguf, precision, Path(tmp))
            return Engine(ModelRunner(converted.onnx_path, "cpu"), tokenizer, template, converted)

        full = engine("int4")
        for form in args.forms.split(","):
            half = engine(form)
            for text in PROMPTS:
                ids = full.encode_prompt(full.render([{"role": "user", "content": text}]))
                a = full.runner.forward(ids, full.runner.new_cache())[-1]
                b = half.runner.forward(ids, half.runner.new_cache())[-1]
                full.reset()
                half.reset()
                same = full.generate(ids, SamplingParams.greedy_params(), args.tokens).tokens == \
                    half.generate(ids, SamplingParams.greedy_params(), args.tokens).tokens
                print(f"{form:>16} {len(ids):>4} tokens: max |diff| {np.abs(a - b).max():.4f} of max |logit| "
                      f"{np.abs(a).max():.2f}, NaN {bool(np.isnan(b).any())}, greedy {args.tokens} the same: {same}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
