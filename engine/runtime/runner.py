"""One ONNX Runtime session for a converted model, and one forward pass over the engine's KV cache."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from engine.arch import io_names
from engine.arch.config import ModelConfig
from engine.errors import ModelFileError, ProviderError
from engine.runtime import cuda_kernels, native_attention, native_matmul, providers
from engine.runtime.kv_cache import KVCache

log = logging.getLogger(__name__)


def default_threads() -> int:
    """Physical cores are what matter for GEMM; os.cpu_count() counts hyperthreads too."""
    count = os.cpu_count() or 1
    try:
        siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text()
        per_core = len(siblings.replace("-", ",").split(",")) if "," in siblings or "-" in siblings else 1
        return max(1, count // per_core)
    except OSError:
        return count


def session_options(threads: int | None, profile_prefix: str | None = None):
    """Options for one InferenceSession: ``threads`` intra-op threads that spin between a run's nodes.
    ``profile_prefix``: record per-node times (bench/decode_profile.py), written by end_profiling()."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or default_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    # ...but only within a run: threads left spinning after one took a core from whatever came next
    # (a checkpoint restore ran 45 instead of 34 ms on 2 cores); decode speed is unchanged.
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return options


class ModelRunner:
    """Owns the InferenceSession; ``forward`` runs tokens through it, extending a KVCache in place.

    ``cpu_fallback=False``: CUDA or nothing (ProviderError, with the reason), for a graph made for CUDA.
    On the CPU, Hearth's own attention kernel runs when it can (``attention`` says which did).
    """

    def __init__(self, onnx_path: Path, provider: str = "auto", threads: int | None = None, *,
                 cpu_fallback: bool = True, profile_prefix: str | None = None):
        self.path = Path(onnx_path)
        self.provider_note = ""
        self.attention = "onnxruntime"  # whose CPU attention kernel runs: "hearth" (native_attention.py) or this
        self.head = "onnxruntime"  # whose output head: "hearth" (HeadQ8 over the table's blocks) or this
        options = session_options(threads, profile_prefix)
        # Whose matmuls: "hearth (ISA)" for a graph on the GGUF's blocks (native_matmul.py), "hearth (CUDA)" for one
        # on them through the CUDA kernels (cuda_kernels.py). Such a graph needs the library in every session.
        self.matmul = "onnxruntime"
        domains = native_matmul.graph_domains(self.path)
        if native_matmul.DOMAIN in domains:
            native_matmul.register_library(options)
            self.matmul = f"hearth ({native_matmul.chosen_isa()})"
        if cuda_kernels.DOMAIN in domains:
            cuda_kernels.register_library(options)
            self.matmul = "hearth (CUDA)"
        candidates = [n for n in providers.candidate_providers(provider) if cpu_fallback or n != "cpu"]
        last_error = ""
        self.session = None
        for name in candidates:
            if name == "cuda":
                last_error = providers.cuda_unavailable()
                if last_error:
                    continue
            if name == "cpu":
                opened = native_attention.open_native_session(
                    self.path, session_options(threads, profile_prefix),
                    lambda model, opts: providers.open_session(model, opts, providers.ort_provider_list("cpu")))
                if opened is not None:
                    session, graph = opened
                    self.session, self.provider, self.attention = session, "cpu", "hearth"
                    self.head = "hearth" if graph.head else "onnxruntime"
                    break
            # A missing CUDA library is an expected outcome of probing, not an error to print.
            providers.quiet_onnxruntime(4 if name == "cuda" else 3)
            try:
                session = providers.open_session(self.path, options, providers.ort_provider_list(name))
            except Exception as exc:  # ORT raises its own exception types for bad models
                if name == "cpu":
                    raise ModelFileError(f"cannot load the converted model {self.path}: {exc}") from exc
                last_error = str(exc).splitlines()[0][:200]
                continue
            finally:
                providers.quiet_onnxruntime()
            landed = session.get_providers()[0]
            if landed != providers.ort_name(name):
                last_error = "its libraries or a usable GPU are missing"
                if landed != providers.ort_name("cpu") or "cpu" not in candidates:
                    continue
                name = "cpu"  # ONNX Runtime fell back to the CPU by itself: this is the CPU session
            self.session, self.provider = session, name
            break
        if self.session is None:
            raise ProviderError(f"no execution provider could load the model ({last_error})", last_error)
        if provider != "cpu" and self.provider == "cpu" and last_error:
            self.provider_note = providers.fallback_note(provider, last_error)

        meta = self.session.get_modelmeta().custom_metadata_map
        try:
            self.config = ModelConfig.from_json(meta["hearth.config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{self.path} was not made by Hearth's converter (no usable metadata)") from exc
        self.precision = meta.get("hearth.precision", "?")
        self.kv_dtype = np.dtype(np.float16 if meta.get("hearth.kv_dtype") == "float16" else np.float32)
        self.all_logits = meta.get("hearth.logits") == "all"
        self._binding = self.session.io_binding()
        # Graphs whose last-position slice reads logits_start can return the last n positions' logits
        # (prompt-lookup verification); older conversions cannot, and decode one token at a time.
        self.can_verify = self.all_logits or io_names.LOGITS_START in {i.name for i in self.session.get_inputs()}
        self._has_start = io_names.LOGITS_START in {i.name for i in self.session.get_inputs()}
        # Decode steps replay a CUDA graph where every node runs on the GPU (the fp16 graphs): 2.4× the
        # decode speed on an H200, the same tokens (cuda_graph.py). HEARTH_CUDA_GRAPH=0 turns it off.
        self.graph = None
        if (self.provider == "cuda" and self.kv_dtype == np.float16 and not self.all_logits
                and os.environ.get("HEARTH_CUDA_GRAPH", "1") != "0"):
            from engine.runtime.cuda_graph import GraphDecoder

            try:
                self.graph = GraphDecoder(self.path, options, self.config.vocab_size)
            except Exception as exc:  # capture is an optimisation: without it, decode as usual
                log.warning("CUDA graphs unavailable: %s", str(exc).splitlines()[0][:200])

    def new_cache(self) -> KVCache:
        c = self.config
        return KVCache(c.n_layers, c.n_head_kv, c.head_dim, c.context_length, device=self.provider, dtype=self.kv_dtype)

    def forward(self, token_ids: np.ndarray | list[int], cache: KVCache, last: int = 1) -> np.ndarray:
        """Run ``token_ids`` after the cache's rows; return logits [n_positions, vocab] as float32.

        ``n_positions`` is ``last`` (the last positions, 1 to decode; more needs ``can_verify``) unless the
        model was built with all logits.
        """
        ids = np.asarray(token_ids, dtype=np.int64).reshape(1, -1)
        n = ids.shape[1]
        if n == 0:
            raise ValueError("forward needs at least one token")
        if not 1 <= last <= n or (last > 1 and not self.can_verify):
            raise ValueError(f"cannot return logits for the last {last} of {n} positions with this graph")
        if n == 1 and self.graph is not None and cache.length + 1 <= cache.capacity:
            return self.graph.step(int(ids[0, 0]), cache)
        total = cache.length + n
        cache.reserve(total)
        b = self._binding
        # Everything is bound afresh each step. Keeping the KV bindings across steps saved ~0.5 ms a
        # step on the GPU but gave wrong results on CUDA whenever a node ran on the CPU (measured on
        # an H200 with the fp32 graph), so it is not worth the risk.
        b.clear_binding_inputs()
        b.clear_binding_outputs()
        b.bind_cpu_input(io_names.INPUT_IDS, ids)
        b.bind_cpu_input(io_names.SEQLENS_K, np.array([total - 1], dtype=np.int32))
        b.bind_cpu_input(io_names.TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        if self._has_start:
            b.bind_cpu_input(io_names.LOGITS_START, np.array([-last], dtype=np.int64))
        b.bind_output(io_names.LOGITS, "cpu")  # bound first, so it is output 0 below
        for i in range(cache.n_layers):
            cache.bind_layer(b, i)
        self.session.run_with_iobinding(b)
        cache.length = total
        # Only the logits: copy_outputs_to_cpu() would also copy every bound KV buffer, whole, while
        # holding the GIL (that copy was most of a decode step's cost at long context).
        return np.array(b.get_outputs()[0].numpy()[0])
