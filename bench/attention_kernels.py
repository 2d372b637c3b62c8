"""Attention alone (not a test): ONNX Runtime's GroupQueryAttention against Hearth's kernel, in one run.

    python bench/attention_kernels.py [--contexts 512,8192] [--chunks 1,2,8,20,64] [--threads 2]
                                      [--layers 30 --heads 9 --kv-heads 3 --head-dim 64]

A graph of ``--layers`` attention nodes and nothing else, shaped like the default model's (SmolLM2-135M:
30 layers, 9 query heads over 3 KV heads of 64), each over its own KV buffer bound as both past and
present, as the engine binds them. For each context it times ``--chunks`` new tokens over that many
cached rows (1 is a decode step; ~20 is a new chat message after a resume), alternating the kernels
A/B/B/A, best of ``--repeats``. The floor column is what reading every K and V byte once costs on this
machine (a ReduceMax over a buffer the size of the whole cache, same threads). Prints a table and writes
bench/results/attention_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def attention_graph(op: str, domain: str, layers: int, heads: int, kv_heads: int, d: int) -> bytes:
    from onnx import TensorProto, helper

    width = (heads + 2 * kv_heads) * d
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, [1, None, width]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    nodes, outputs = [], []
    for i in range(layers):
        kv_shape = [1, kv_heads, None, d]
        inputs += [helper.make_tensor_value_info(f"past_key.{i}", TensorProto.FLOAT, kv_shape),
                   helper.make_tensor_value_info(f"past_value.{i}", TensorProto.FLOAT, kv_shape)]
        outputs += [helper.make_tensor_value_info(f"present_key.{i}", TensorProto.FLOAT, kv_shape),
                    helper.make_tensor_value_info(f"present_value.{i}", TensorProto.FLOAT, kv_shape)]
        nodes.append(helper.make_node(op, ["qkv", "", "", f"past_key.{i}", f"past_value.{i}", "seqlens", "total"],
                                      [f"out.{i}", f"present_key.{i}", f"present_value.{i}"], domain=domain,
                                      num_heads=heads, kv_num_heads=kv_heads))
    nodes.append(helper.make_node("Sum", [f"out.{i}" for i in range(layers)], ["out"]))
    outputs.insert(0, helper.make_tensor_value_info("out", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attention", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=9).SerializeToString()


class Kernel:
    """One session of ``layers`` attention nodes over preallocated KV buffers of ``capacity`` rows."""

    def __init__(self, name: str, args: argparse.Namespace, capacity: int, rng: np.random.Generator):
        import onnxruntime as ort

        from engine.runtime import native_attention, native_library
        from engine.runtime.runner import session_options

        self.name, self.args = name, args
        native = name == "hearth"
        options = session_options(args.threads)
        if native:
            options.register_custom_ops_library(str(native_library.platform_library()))
        op, domain = ((native_attention.OP_TYPE, native_attention.DOMAIN) if native
                      else ("GroupQueryAttention", "com.microsoft"))
        graph = attention_graph(op, domain, args.layers, args.heads, args.kv_heads, args.head_dim)
        self.session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        shape = (1, args.kv_heads, capacity, args.head_dim)
        self.buffers = [ort.OrtValue.ortvalue_from_numpy(rng.standard_normal(shape, np.float32))
                        for _ in range(2 * args.layers)]
        self.rng = rng

    def time(self, past: int, new: int, repeats: int) -> float:
        """Best milliseconds for ``new`` tokens over ``past`` cached rows."""
        a, b = self.args, self.session.io_binding()
        b.bind_cpu_input("qkv", self.rng.standard_normal((1, new, (a.heads + 2 * a.kv_heads) * a.head_dim), np.float32))
        b.bind_cpu_input("seqlens", np.array([past + new - 1], np.int32))
        b.bind_cpu_input("total", np.array(past + new, np.int32))
        b.bind_output("out", "cpu")
        for i in range(a.layers):
            for kind, buf in (("key", self.buffers[2 * i]), ("value", self.buffers[2 * i + 1])):
                b.bind_ortvalue_input(f"past_{kind}.{i}", buf)
                b.bind_ortvalue_output(f"present_{kind}.{i}", buf)
        self.session.run_with_iobinding(b)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            self.session.run_with_iobinding(b)
            best = min(best, time.perf_counter() - start)
        return best * 1000


def read_floor_ms(nbytes: int, threads: int) -> float:
    """Reading ``nbytes`` once with ONNX Runtime's ReduceMax on ``threads`` threads (best of 3)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from engine.runtime.runner import session_options

    graph = helper.make_graph([helper.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], "read",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
    x = np.ones((max(1, nbytes // (4 << 20)), 1 << 20), np.float32)
    session.run(None, {"x": x})
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        session.run(None, {"x": x})
        best = min(best, time.perf_counter() - start)
    return best * 1000 * nbytes / x.nbytes


def main() -> int:
    from engine.runtime import native_library

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="512,8192")
    ap.add_argument("--chunks", default="1,2,8,20,64")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "attention_kernels.json"))
    args = ap.parse_args()
    if native_library.platform_library() is None:
        print("no prebuilt Hearth kernel for this platform", file=sys.stderr)
        return 1
    rows = []
    rng = np.random.default_rng(0)
    chunks = [int(c) for c in args.chunks.split(",")]
    for ctx in (int(c) for c in args.contexts.split(",")):
        capacity = -(-(ctx + max(chunks)) // 256) * 256
        kernels = [Kernel("onnxruntime", args, capacity, rng), Kernel("hearth", args, capacity, rng)]
        floor = read_floor_ms(2 * args.layers * args.kv_heads * ctx * args.head_dim * 4, args.threads)
        for new in chunks:
            past = ctx - new
            times: dict[str, float] = {}
            for kernel in kernels + kernels[::-1]:  # A B B A
                ms = kernel.time(past, new, args.repeats)
                times[kernel.name] = min(times.get(kernel.name, ms), ms)
            rows.append({"context": ctx, "new_tokens": new, "onnxruntime_ms": times["onnxruntime"],
                         "hearth_ms": times["hearth"], "read_floor_ms": floor})
    print(f"{'context':>8} {'new':>5} {'ORT GQA ms':>11} {'Hearth ms':>10} {'speed-up':>9} {'read floor ms':>14}")
    for r in rows:
        print(f"{r['context']:>8} {r['new_tokens']:>5} {r['onnxruntime_ms']:>11.2f} {r['hearth_ms']:>10.2f} "
              f"{r['onnxruntime_ms'] / r['hearth_ms']:>8.2f}x {r['read_floor_ms']:>14.2f}")
    result = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
              "shape": {k: getattr(args, k) for k in ("layers", "heads", "kv_heads", "head_dim", "threads")},
              "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
