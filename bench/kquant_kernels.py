"""What a linear layer straight from the GGUF's blocks costs (ai.hearth.MatMulQ, engine/native/hearth_matmul*.c).

For each weight type, decode (1 row of X) and prefill (64 rows) shapes of one [N, K] matrix: MatMulQ exact and
fast under each instruction set this CPU has, beside ONNX Runtime's dense fp32 MatMul over the same weights
(what an 8-bit type became before these kernels), in one process and one session configuration, so the
ratios are what to read. Weights per second is N·K·rows / time; GB/s is the blocks' bytes per decode call.

    .venv/bin/python -m bench.kquant_kernels [--n 2048 --k 2048 --threads 2 --repeats 30 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper

from bench.gather_q import BLOCKS, random_table
from engine.runtime import native_library
from engine.runtime.runner import session_options

log = logging.getLogger("bench.kquant_kernels")
ISAS = ("portable", "avx2", "avx512", "avx512vnni")


def _model(node: helper.NodeProto, w: np.ndarray, name: str) -> bytes:
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.hearth", 1)],
                             ir_version=9).SerializeToString()


def _session(model: bytes, threads: int, library: Path | None) -> ort.InferenceSession:
    options = session_options(threads)
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _seconds(session: ort.InferenceSession, x: np.ndarray, repeats: int) -> float:
    session.run(None, {"x": x})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--types", default=",".join(t.name for t in BLOCKS))
    ap.add_argument("--isas", default="", help="comma list (default: every one this CPU has)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    library = native_library.platform_library()
    if library is None:
        raise SystemExit("no prebuilt kernel library for this platform")
    rng = np.random.default_rng(0)
    isas = [i for i in (args.isas.split(",") if args.isas else ISAS)]
    rows_out, results = [], []
    log.info("load: %s; N=%d K=%d, %d threads, medians of %d", os.getloadavg(), args.n, args.k, args.threads,
             args.repeats)
    header = f"{'type':6} {'rows':>4} {'dense fp32 ms':>14}" + "".join(f" {isa + ' ' + n:>22}" for isa in isas
                                                                      for n in ("exact", "fast"))
    for name in args.types.split(","):
        qtype = T[name]
        w = random_table(rng, qtype, args.n, args.k)
        dense = np.ascontiguousarray(dequantize(w, qtype).T.astype(np.float32))
        dense_session = _session(_model(helper.make_node("MatMul", ["x", "w"], ["y"]), dense, "dense"), args.threads, None)
        for m in (1, 64):
            x = rng.standard_normal((1, m, args.k)).astype(np.float32)
            base = _seconds(dense_session, x, args.repeats)
            entry = {"type": name, "rows": m, "dense_ms": base * 1e3}
            cells = []
            for isa in isas:
                os.environ["HEARTH_KERNEL_ISA"] = isa
                for fast in (0, 1):
                    node = helper.make_node("MatMulQ", ["x", "w"], ["y"], domain="ai.hearth", type=int(qtype), fast=fast)
                    try:
                        session = _session(_model(node, w, "q"), args.threads, library)
                    except Exception as exc:  # an instruction set this CPU lacks
                        log.info("%s: %s", isa, str(exc).splitlines()[-1])
                        cells.append(f" {'-':>22}")
                        continue
                    seconds = _seconds(session, x, args.repeats)
                    key = f"{isa}_{'fast' if fast else 'exact'}"
                    entry[key + "_ms"] = seconds * 1e3
                    cells.append(f" {seconds * 1e3:9.3f} ms {base / seconds:6.2f}x")
            os.environ.pop("HEARTH_KERNEL_ISA", None)
            results.append(entry)
            rows_out.append(f"{name:6} {m:>4} {base * 1e3:14.3f}" + "".join(cells))
        elements, size = BLOCKS[qtype]
        log.info("%s: %.2f bytes a weight (dense fp32: 4)", name, size / elements)
    print(header)  # noqa: T201 - the table is the benchmark's output
    print("\n".join(rows_out))  # noqa: T201
    log.info("(x: dense fp32 MatMul's time over MatMulQ's; above 1 is faster)")
    if args.json:
        Path(args.json).write_text(json.dumps({"n": args.n, "k": args.k, "threads": args.threads,
                                               "load": os.getloadavg(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
