"""Which form of an 8-bit-held layer (Q6_K, Q8_0, …) decodes fastest on CUDA (not a test).

A chain of ``--layers`` square [K × K] layers, each with its own weights (so no layer is served from
the GPU's cache), run on one fp16 row with inputs and outputs bound on the device: the time per
layer and the bytes it reads give the bandwidth each form reaches. Forms: Hearth's CUDA ``MatMulQ`` over the
GGUF's own blocks of each type; dense fp16 ``MatMul``;
``MatMulNBits`` 4-bit (the Q4_K layers' form, for reference), 8-bit with blocks of 16 and 32, and an
8-bit layer as two 4-bit planes (engine/model/quant.py: split_planes), input doubled per block.

    python bench/cuda_layer_forms.py [--k 4096 --layers 32 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine.model.synthetic import random_k_blocks  # noqa: E402
from engine.runtime import cuda_kernels  # noqa: E402

MS = "com.microsoft"


def _layer(form: str, i: int, x: str, k: int, rng) -> tuple[list, list, int]:
    """(nodes, initializers, bytes read) of layer ``i`` in ``form``, output ``y{i}``."""
    y, p = f"y{i}", f"l{i}."
    if form.startswith("Hearth "):  # the GGUF's blocks through Hearth's CUDA MatMulQ (engine/native/cuda/)
        type_name = form.split()[-1]
        blocks = _gguf_blocks(rng, type_name, k)
        numerics = {"numerics": cuda_kernels.NUMERICS_INT8} if " int8 " in form else {}
        node = helper.make_node("MatMulQ", [x, p + "q"], [y], domain=cuda_kernels.DOMAIN,
                                type=cuda_kernels.TYPE_IDS[type_name], **numerics)
        return [node], [numpy_helper.from_array(blocks, p + "q")], blocks.nbytes
    if form == "dense fp16":
        w = (rng.standard_normal((k, k)) * 0.01).astype(np.float16)
        return [helper.make_node("MatMul", [x, p + "w"], [y])], [numpy_helper.from_array(w, p + "w")], w.nbytes
    bits, block, planes = {"4-bit block 32": (4, 32, 1), "4-bit block 32, fp16 zero points": (4, 32, 1),
                           "4-bit block 32, uint8 zero points": (4, 32, 1), "4-bit block 32 + offset branch": (4, 32, 1),
                           "8-bit block 16": (8, 16, 1), "8-bit block 32": (8, 32, 1),
                           "8-bit as 4-bit planes, block 16": (4, 16, 2)}[form]
    nb = k // block
    blob = rng.integers(0, 256, (k, nb * planes, block * bits // 8), dtype=np.uint8)
    scales = (rng.random(k * nb * planes) * 1e-3).astype(np.float16)
    inits = [numpy_helper.from_array(blob, p + "b"), numpy_helper.from_array(scales, p + "s")]
    inputs, nodes = [x, p + "b", p + "s"], []
    if planes == 2:
        inits += [numpy_helper.from_array(np.full(k * nb, 0x80, np.uint8), p + "z"),
                  numpy_helper.from_array(np.array([1, nb, 1, block], np.int64), p + "pairs"),
                  numpy_helper.from_array(np.array([1, 2 * k], np.int64), p + "flat")]
        nodes += [helper.make_node("Reshape", [x, p + "pairs"], [p + "xp"]),
                  helper.make_node("Concat", [p + "xp", p + "xp"], [p + "xx"], axis=2),
                  helper.make_node("Reshape", [p + "xx", p + "flat"], [p + "x2"])]
        inputs = [p + "x2", p + "b", p + "s", p + "z"]
    extra = 0
    if "fp16 zero points" in form:
        zp = (rng.random(k * nb) * 15).astype(np.float16)
        inits.append(numpy_helper.from_array(zp, p + "z"))
        inputs.append(p + "z")
        extra = zp.nbytes
    elif "uint8 zero points" in form:
        inits.append(numpy_helper.from_array(np.full(k * nb // 2, 0x88, np.uint8), p + "z"))
        inputs.append(p + "z")
        extra = k * nb // 2
    out = y if "branch" not in form else p + "y0"
    nodes.append(helper.make_node("MatMulNBits", inputs, [out], domain=MS, K=k * planes, N=k, bits=bits,
                                  block_size=block))
    if "branch" in form:  # the blocksum side branch int4 uses for Q4_K's mins (engine/arch/blocks.py)
        corr = (rng.standard_normal((nb, k)) * 1e-3).astype(np.float16)
        inits += [numpy_helper.from_array(corr, p + "c"), numpy_helper.from_array(np.array([1, nb, block], np.int64), p + "g"),
                  numpy_helper.from_array(np.array([-1], np.int64), p + "ax")]
        nodes += [helper.make_node("Reshape", [x, p + "g"], [p + "xg"]),
                  helper.make_node("ReduceSum", [p + "xg", p + "ax"], [p + "bs"], keepdims=0),
                  helper.make_node("MatMul", [p + "bs", p + "c"], [p + "off"]),
                  helper.make_node("Add", [out, p + "off"], [y])]
        extra = corr.nbytes
    return nodes, inits, sum(a.nbytes for a in (blob, scales)) + (k * nb if planes == 2 else 0) + extra


def _gguf_blocks(rng, type_name: str, k: int) -> np.ndarray:
    """[k, bytes per row] of random ``type_name`` blocks with sane scales (speed does not depend on the values)."""
    if type_name.endswith("_K"):
        return random_k_blocks(rng, type_name, k, k, 1.0)
    size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q8_0": 34}[type_name]
    raw = rng.integers(0, 256, (k, k // 32, size), dtype=np.uint8)
    raw[:, :, 0:2] = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    if type_name == "Q4_1":
        raw[:, :, 2:4] = np.frombuffer(np.float16(-1e-3).tobytes(), np.uint8)
    return raw.reshape(k, -1)


def measure(form: str, k: int, layers: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    nodes, inits, read = [], [], 0
    x = "x"
    for i in range(layers):
        n, w, b = _layer(form, i, x, k, rng)
        nodes += n
        inits += w
        read += b
        x = f"y{i}"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, k])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1),
                                                    helper.make_opsetid(cuda_kernels.DOMAIN, 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    if form.startswith("Hearth "):
        cuda_kernels.register_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CUDAExecutionProvider"])
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.ones((1, k), np.float16) * 0.01, "cuda", 0))
    binding.bind_output("y", "cuda")
    for _ in range(5):
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    start = time.perf_counter()
    for _ in range(repeats):
        session.run_with_iobinding(binding)
    binding.synchronize_outputs()
    per_layer = (time.perf_counter() - start) / repeats / layers
    return {"form": form, "us_per_layer": per_layer * 1e6, "bytes_per_layer": read / layers,
            "gb_s": read / layers / per_layer / 1e9}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "cuda_layer_forms.json")
    args = ap.parse_args(argv)
    rows = []
    for form in ("dense fp16", "4-bit block 32", "4-bit block 32, fp16 zero points", "4-bit block 32, uint8 zero points",
                 "4-bit block 32 + offset branch", "8-bit block 16", "8-bit block 32", "8-bit as 4-bit planes, block 16",
                 "Hearth Q4_0", "Hearth Q4_1", "Hearth Q5_0", "Hearth Q8_0", "Hearth Q4_K", "Hearth Q5_K", "Hearth Q6_K",
                 "Hearth int8 Q4_0", "Hearth int8 Q4_1", "Hearth int8 Q5_0", "Hearth int8 Q8_0", "Hearth int8 Q4_K",
                 "Hearth int8 Q5_K", "Hearth int8 Q6_K"):
        try:
            rows.append(measure(form, args.k, args.layers, args.repeats))
        except Exception as exc:  # a form this build's CUDA kernel refuses: say so and go on
            rows.append({"form": form, "error": str(exc).splitlines()[0][:200]})
    print(f"[1 × {args.k}] × [{args.k} × {args.k}] fp16, chain of {args.layers}, onnxruntime {ort.__version__}")
    print("| form | µs per layer | MB per layer | GB/s |\n|---|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['form']} | refused: {r['error']} | | |")
        else:
            print(f"| {r['form']} | {r['us_per_layer']:.1f} | {r['bytes_per_layer'] / 1e6:.2f} | {r['gb_s']:.0f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"k": args.k, "layers": args.layers, "onnxruntime": ort.__version__,
                                     "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
