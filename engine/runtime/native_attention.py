"""Hearth's own CPU kernels (engine/native/): its attention kernel (hearth_attention.c), used in place
of ONNX Runtime's GroupQueryAttention when it can be, and with it the output head over the token
table's 8-bit blocks (hearth_head.c) where the model qualifies (native_head.py).

The converted graph keeps ONNX Runtime's GroupQueryAttention nodes; on the CPU the runner loads the
prebuilt kernel library, renames those nodes to ``ai.hearth.Attention`` (same inputs, attributes and
outputs) in memory, and opens that graph instead. The weights file is shared, nothing is written to
disk, and the KV cache layout is the same, so checkpoints do not care which kernel made them.

It is skipped, and ONNX Runtime's kernel runs, when:
- ``HEARTH_NATIVE_ATTENTION=0`` is set;
- there is no library for this platform (only Linux x86-64 is prebuilt);
- the graph is not float32 or uses an attention feature the kernel lacks (softcap and the like);
- loading the library or the session fails (an old ONNX Runtime, a CPU without AVX2/FMA): logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.runtime import native_head
from engine.runtime.native_library import enabled, platform_library

log = logging.getLogger(__name__)

DOMAIN = "ai.hearth"
OP_TYPE = "Attention"
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
# GroupQueryAttention attributes the kernel does not implement (any non-zero value keeps ONNX Runtime's).
UNSUPPORTED_ATTRIBUTES = ("softcap", "smooth_softmax", "rotary_interleaved", "qk_output")
MAX_INPUTS = 9  # query, key, value, past key/value, seqlens_k, total length, cos and sin caches


@dataclass(frozen=True)
class NativeGraph:
    model: bytes  # the serialized graph to open
    head: bool  # its output head runs as ai.hearth.HeadQ8 (native_head.py)


def native_graph(onnx_path: Path) -> NativeGraph | None:
    """The graph at ``onnx_path`` with its GroupQueryAttention nodes running as ai.hearth.Attention (and
    its head as ai.hearth.HeadQ8 where it qualifies), or None when the graph does not qualify (not
    float32, a feature the kernel lacks, no attention)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get("hearth.kv_dtype", "float32") != "float32":
        return None
    renamed = 0
    for node in model.graph.node:
        if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if any(attrs.get(name) for name in UNSUPPORTED_ATTRIBUTES) or len(node.input) > MAX_INPUTS:
            return None
        node.op_type, node.domain = OP_TYPE, DOMAIN
        renamed += 1
    if not renamed:
        return None
    head = native_head.enabled() and native_head.swap_head(model, onnx_path.parent, DOMAIN)
    model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    return NativeGraph(model.SerializeToString(), head)


def open_native_session(onnx_path: Path, options, open_session, library: Path | None = None):
    """(an InferenceSession running the graph with Hearth's kernels, the NativeGraph it runs), or None
    (and why, logged) when it cannot. ``options``: fresh SessionOptions for this attempt;
    ``open_session(model, options)`` makes the session (the runner counts sessions through it)."""
    library = library or platform_library()
    if library is None or not enabled():
        return None
    try:
        graph = native_graph(onnx_path)
        if graph is None:
            log.info("native attention: %s does not qualify; using ONNX Runtime's kernel", onnx_path.name)
            return None
        options.register_custom_ops_library(str(library))
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(onnx_path.parent))
        return open_session(graph.model, options), graph
    except Exception as exc:  # ORT raises its own types; any failure here means "use the plain graph"
        log.warning("native attention unavailable (%s); using ONNX Runtime's kernel", str(exc).splitlines()[0][:200])
        return None
