"""What reading token-table rows straight from GGUF blocks costs (ai.hearth.GatherQ, engine/native/hearth_gather.c).

Two tables, in one process so the ratios are what to read:

* ns per row of ``hearth_dequant_row`` for each type (the library's HearthDequantizeRows over many rows);
* GatherQ in an ONNX Runtime session against ORT's own Gather over the dense fp32 table (today's form),
  for several token counts, on 1 and 2 intra-op threads (GatherQ splits rows over threads only above its
  serial threshold; 1 thread shows what the split buys).

    .venv/bin/python bench/gather_q.py [--k 2048 --vocab 32768 --repeats 200 --json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from onnx import TensorProto, helper, numpy_helper

from engine.runtime import native_library

log = logging.getLogger("bench.gather_q")
BLOCKS = {T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q8_0: (32, 34),
          T.Q2_K: (256, 84), T.Q3_K: (256, 110), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210)}


def random_table(rng: np.random.Generator, qtype: T, rows: int, k: int) -> np.ndarray:
    """Random blocks with small positive fp16 scales in every half field gguf reads (no inf/NaN)."""
    elements, size = BLOCKS[qtype]
    table = rng.integers(0, 256, (rows, k // elements, size), dtype=np.uint8)
    halves = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q6_K: (208,)}.get(qtype, (0, 2))
    for at in halves:
        table[..., at:at + 2] = np.array([0.01], np.float16).view(np.uint8)
    return table.reshape(rows, -1)


def dequant_ns_per_row(lib: ctypes.CDLL, qtype: T, table: np.ndarray, k: int, repeats: int) -> float:
    out = np.empty((table.shape[0], k), np.float32)
    args = (int(qtype), table.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), table.shape[0], k,
            out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)))
    times = []
    for _ in range(repeats):  # 16 rows: the output stays in L2, so this is the unpack, not DRAM
        start = time.perf_counter()
        lib.HearthDequantizeRows(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / table.shape[0] * 1e9


def _session(nodes: list, inits: list, threads: int) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.hearth", 1)],
                              ir_version=9)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(str(native_library.platform_library()))
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_us(session: ort.InferenceSession, ids: np.ndarray, repeats: int) -> float:
    session.run(None, {"ids": ids})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {"ids": ids})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    lib = ctypes.CDLL(str(native_library.platform_library()))
    rng = np.random.default_rng(0)
    results: dict = {"k": args.k, "vocab": args.vocab, "dequant_ns_per_row": {}, "gather_us": []}
    log.info("hearth_dequant_row, k = %d: ns per row", args.k)
    for qtype in BLOCKS:
        ns = dequant_ns_per_row(lib, qtype, random_table(rng, qtype, 16, args.k), args.k, args.repeats)
        results["dequant_ns_per_row"][qtype.name] = ns
        log.info("  %-5s %8.0f", qtype.name, ns)
    qtype = T.Q4_K
    table = random_table(rng, qtype, args.vocab, args.k)
    dense = dequantize(table, qtype)
    log.info("%s table [%d, %d]: median us per run", qtype.name, args.vocab, args.k)
    log.info("  %6s %7s %12s %12s", "tokens", "threads", "GatherQ", "Gather fp32")
    for threads in (1, 2):
        native = _session([helper.make_node("GatherQ", ["ids", "w"], ["y"], domain="ai.hearth", type=int(qtype),
                                            k=args.k)], [numpy_helper.from_array(table, "w")], threads)
        plain = _session([helper.make_node("Gather", ["w", "ids"], ["y"])], [numpy_helper.from_array(dense, "w")],
                         threads)
        for tokens in (1, 2, 4, 8, 16, 64, 512):
            ids = rng.integers(0, args.vocab, (1, tokens)).astype(np.int64)
            row = {"tokens": tokens, "threads": threads, "gatherq": run_us(native, ids, args.repeats),
                   "gather_fp32": run_us(plain, ids, args.repeats)}
            results["gather_us"].append(row)
            log.info("  %6d %7d %12.1f %12.1f", tokens, threads, row["gatherq"], row["gather_fp32"])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
