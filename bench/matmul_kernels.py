"""How fast ONNX Runtime's CPU kernels run one linear layer in each form the converter can give it.

A decode step is one row (M = 1) through every layer; prefill is many rows. This times one
[M, K] × [K, N] product per form, in one process, so the ratios between forms are what to read:

* dense fp32 ``MatMul`` (what an unpacked layer runs);
* ``MatMulNBits`` 4-bit and 8-bit at accuracy levels 0 (fp32 activations: exact ``int4``) and
  4 (int8 activations: ``int4-fast``), with and without float zero points;
* an 8-bit layer split into two 4-bit planes with uint8 zero points (engine/model/quant.py:
  split_planes), input doubled per block as the graph does it.

    .venv/bin/python bench/matmul_kernels.py [--k 2048 --n 8192 --m 1 --threads 2 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def _model(nodes: list, inits: list, m: int, k: int, n: int) -> bytes:
    graph = helper.make_graph(nodes, "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _time(model: bytes, x: np.ndarray, threads: int, repeats: int) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, {"x": x})
    start = time.perf_counter()
    for _ in range(repeats):
        session.run(None, {"x": x})
    return (time.perf_counter() - start) / repeats * 1e3


def forms(k: int, n: int, m: int, rng: np.random.Generator):
    """(name, nodes, initializers) for each form of one [k → n] layer."""
    dense = rng.standard_normal((k, n)).astype(np.float32)
    yield "dense fp32 MatMul", [helper.make_node("MatMul", ["x", "w"], ["y"])], [numpy_helper.from_array(dense, "w")]
    for bits, block in ((4, 32), (4, 16), (8, 32), (8, 16)):
        nb = k // block
        blob = rng.integers(0, 256, (n, nb, block * bits // 8), dtype=np.uint8)
        scales = rng.random(n * nb).astype(np.float32)
        for acc in (0, 4):
            for zero in ("default", "float") if bits == 4 else ("default",):
                inits = [numpy_helper.from_array(blob, "b"), numpy_helper.from_array(scales, "s")]
                inputs = ["x", "b", "s"]
                if zero == "float":
                    inits.append(numpy_helper.from_array((rng.random(n * nb) * 8).astype(np.float32), "z"))
                    inputs.append("z")
                node = helper.make_node("MatMulNBits", inputs, ["y"], domain=MS, K=k, N=n, bits=bits, block_size=block,
                                        accuracy_level=acc)
                yield f"{bits}-bit block {block} acc {acc}, {zero} zero points", [node], inits
    for block in (32, 16):
        nb = k // block
        inits = [numpy_helper.from_array(rng.integers(0, 256, (n, 2 * nb, block // 2), dtype=np.uint8), "b"),
                 numpy_helper.from_array(rng.random(n * 2 * nb).astype(np.float32), "s"),
                 numpy_helper.from_array(np.full(n * nb, 0x80, np.uint8), "z"),
                 numpy_helper.from_array(np.array([0, nb, 1, block], np.int64), "pairs"),
                 numpy_helper.from_array(np.array([0, 2 * k], np.int64), "flat")]
        nodes = [helper.make_node("Reshape", ["x", "pairs"], ["xp"]),
                 helper.make_node("Concat", ["xp", "xp"], ["xx"], axis=2),
                 helper.make_node("Reshape", ["xx", "flat"], ["x2"]),
                 helper.make_node("MatMulNBits", ["x2", "b", "s", "z"], ["y"], domain=MS, K=2 * k, N=n, bits=4,
                                  block_size=block, accuracy_level=0)]
        yield f"8-bit as two 4-bit planes, block {block} acc 0", nodes, inits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--m", type=int, default=1, help="rows: 1 is a decode step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "matmul_kernels.json")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.m, args.k)).astype(np.float32)
    repeats = 20 if args.m == 1 else 3
    rows = []
    for name, nodes, inits in forms(args.k, args.n, args.m, rng):
        ms = _time(_model(nodes, inits, args.m, args.k, args.n), x, args.threads, repeats)
        rows.append({"form": name, "ms": round(ms, 3)})
    base = rows[0]["ms"]
    print(f"[{args.m} × {args.k}] × [{args.k} × {args.n}], {args.threads} threads, onnxruntime {ort.__version__}")
    print("| form | ms | × dense fp32 time |\n|---|---:|---:|")
    for row in rows:
        row["vs_dense"] = round(row["ms"] / base, 2)
        print(f"| {row['form']} | {row['ms']:.2f} | {row['vs_dense']:.2f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"k": args.k, "n": args.n, "m": args.m, "threads": args.threads,
                                     "onnxruntime": ort.__version__, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
