"""The KV cache the engine owns: one preallocated buffer per layer for keys and one for values.

Each buffer is bound as both the ``past`` input and the ``present`` output of GroupQueryAttention,
so a step writes its new rows in place instead of copying the whole past. Rows [0, length) are
valid; everything after is scratch. Cutting the cache is therefore just lowering ``length``: causal
attention makes row i depend only on tokens 0..i, so the kept rows are exactly what a fresh prefill
of the kept tokens would produce.

On the CPU, buffers grow in steps of 256 rows, to use memory in proportion to the conversation
(a full 8k-token cache of the default model is 377 MB). A step's cost does not depend on the
capacity: 59.2 tok/s at 460 tokens in 512-, 2,048- and 8,192-row buffers alike, measured once the
runner stopped copying whole outputs (see docs/benchmarks.md).

On a GPU the whole context is allocated once, as one buffer [layers, 2 (K, V), heads, capacity,
head_dim] whose per-layer slices are bound by address, and rows move between it and the host in one
strided copy for all layers (cuda_copy.py), through a pinned staging array in the checkpoint's order.

Checkpoint I/O sees only the row protocol of kv_protocol.py (``length``, ``truncate``, ``read_rows``,
``write_rows``); which of these layouts holds the rows, and in which element type, stays in here.
"""

from __future__ import annotations

import logging
import mmap

import numpy as np

from engine.arch import io_names
from engine.runtime.kv_protocol import BlocksFn, RowSource

log = logging.getLogger(__name__)

GROWTH_STEP = 256


class KVCache:
    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, max_tokens: int, device: str = "cpu",
                 dtype: np.dtype | type = np.float32):
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.max_tokens = max_tokens
        self.device = device
        self.dtype = np.dtype(dtype)  # float32, or float16 for an fp16-compute model
        self.length = 0
        self.capacity = 0
        self.keys: list = []  # OrtValue per layer (CPU)
        self.values: list = []
        self.arena = None  # one OrtValue for every layer (GPU)
        self._stage: np.ndarray | None = None  # pinned host rows, reused between restores (GPU)
        # On a GPU the whole context is allocated once and never moves: growing would copy every row
        # through the host, and the memory is there. On the CPU the cache grows in steps (see above).
        self._allocate(max_tokens if self.on_device else min(GROWTH_STEP, max_tokens))

    @property
    def on_device(self) -> bool:
        return self.device != "cpu"

    # shape and memory ---------------------------------------------------------------------------
    def _shape(self, capacity: int) -> tuple[int, int, int, int]:
        return (1, self.n_kv_heads, capacity, self.head_dim)

    def _new_buffer(self, capacity: int):
        """A zeroed buffer. On the CPU it is an anonymous memory map: the kernel zero-fills each page
        when it is first written, so nothing is zeroed twice, and the pages are ordinary 4 KiB ones.
        (numpy's own large allocations ask for transparent huge pages; after the page cache has
        fragmented memory, faulting those in stalled a restore for up to 0.5 s.)"""
        import onnxruntime as ort

        shape = self._shape(capacity)
        if self.device == "cpu":
            area = mmap.mmap(-1, int(np.prod(shape)) * self.dtype.itemsize)
            return ort.OrtValue.ortvalue_from_numpy(np.frombuffer(area, dtype=self.dtype).reshape(shape))
        return _zeroed_on_device(shape, self.dtype)

    def _allocate(self, capacity: int) -> None:
        if self.on_device:
            shape = [self.n_layers, 2, self.n_kv_heads, capacity, self.head_dim]
            self.arena = _zeroed_on_device(shape, self.dtype)
            self.capacity = capacity
            return
        old_k, old_v, keep = self.keys, self.values, self.length
        self.keys = [self._new_buffer(capacity) for _ in range(self.n_layers)]
        self.values = [self._new_buffer(capacity) for _ in range(self.n_layers)]
        if keep:
            for src, dst in ((old_k, self.keys), (old_v, self.values)):
                for i in range(self.n_layers):
                    self._copy_in(dst[i], 0, self._copy_out(src[i], 0, keep))
        self.capacity = capacity

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` rows in total (in steps of GROWTH_STEP; never past the context)."""
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the context of {self.max_tokens}")
        if tokens <= self.capacity or self.on_device:
            return
        steps = -(-tokens // GROWTH_STEP)
        self._allocate(min(steps * GROWTH_STEP, self.max_tokens))

    def fit_for_overwrite(self, tokens: int) -> None:
        """Make an empty cache's capacity exactly ``tokens`` rounded up to a step, keeping the current
        buffers when they already are that size (switching between long chats then allocates and
        page-faults nothing). Rows before ``tokens`` are left for the caller to write."""
        if self.length:
            raise ValueError("fit_for_overwrite needs an empty cache")
        wanted = min(max(GROWTH_STEP, -(-tokens // GROWTH_STEP) * GROWTH_STEP), self.max_tokens)
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} tokens exceed the context of {self.max_tokens}")
        if wanted != self.capacity and not self.on_device:
            self._allocate(wanted)

    def clear(self, start: int, end: int) -> None:
        """Zero rows [start, end) (scratch rows a failed restore left half-written)."""
        for buf in (*self.keys, *self.values):
            if self.device == "cpu":
                buf.numpy()[:, :, start:end, :] = 0

    def shrink_to_fit(self) -> None:
        """Drop capacity far beyond the rows in use (after a cut), since unused rows slow decode.
        (A GPU cache keeps its one allocation.)"""
        if self.on_device:
            return
        wanted = min(max(GROWTH_STEP, -(-self.length // GROWTH_STEP) * GROWTH_STEP), self.max_tokens)
        if wanted < self.capacity:
            self._allocate(wanted)

    # binding ------------------------------------------------------------------------------------
    def bind_layer(self, binding, layer: int) -> None:
        """Bind layer ``layer``'s keys and values as both the past inputs and the present outputs."""
        names = ((io_names.past_key(layer), io_names.present_key(layer)),
                 (io_names.past_value(layer), io_names.present_value(layer)))
        if not self.on_device:
            for (past, present), buf in zip(names, (self.keys[layer], self.values[layer]), strict=True):
                binding.bind_ortvalue_input(past, buf)
                binding.bind_ortvalue_output(present, buf)
            return
        shape = [1, self.n_kv_heads, self.capacity, self.head_dim]
        for kv, (past, present) in enumerate(names):
            address = self._device_address(layer, kv, 0)
            binding.bind_input(past, "cuda", 0, self.dtype.type, shape, address)
            binding.bind_output(present, "cuda", 0, self.dtype.type, shape, address)

    def _device_address(self, layer: int, kv: int, row: int) -> int:
        head_block = self.capacity * self.head_dim
        return self.arena.data_ptr() + (((layer * 2 + kv) * self.n_kv_heads) * head_block + row * self.head_dim) * \
            self.dtype.itemsize

    # rows in and out on a GPU: one strided copy for every layer, key, value and head -------------
    def staging(self, n: int) -> np.ndarray:
        """A host array [layers, 2, heads, n, head_dim] to gather rows in before ``load_staged``
        (pinned and reused when the CUDA runtime is at hand). Its contents are scratch."""
        from engine.runtime.cuda_copy import CudaError, cuda_runtime

        shape = (self.n_layers, 2, self.n_kv_heads, n, self.head_dim)
        runtime = cuda_runtime() if self.on_device else None
        if runtime is None:
            return np.empty(shape, self.dtype)
        if self._stage is None or self._stage.size < int(np.prod(shape)):
            self._stage = None
            try:
                self._stage = runtime.pinned((int(np.prod(shape)),), self.dtype)
            except CudaError as exc:  # page-locked memory is limited; pageable memory only copies slower
                log.warning("no pinned staging memory (%s); using ordinary memory", exc)
                return np.empty(shape, self.dtype)
        return self._stage[: int(np.prod(shape))].reshape(shape)

    def load_staged(self, stage: np.ndarray, start: int = 0) -> None:
        """Rows [start, start + n) from a staging array; the length becomes their end."""
        from engine.runtime.cuda_copy import cuda_runtime

        n = stage.shape[3]
        expected = (self.n_layers, 2, self.n_kv_heads, n, self.head_dim)
        if stage.shape != expected or stage.dtype != self.dtype:
            raise ValueError(f"staged rows are {stage.shape} {stage.dtype}, expected {expected} {self.dtype}")
        if not 0 <= start <= self.length or start + n > self.capacity:
            raise ValueError(f"cannot write rows [{start}, {start + n}) into a cache of {self.length}/{self.capacity}")
        runtime = cuda_runtime() if self.on_device else None
        if runtime is None:
            self.load(stage[:, 0], stage[:, 1], start)
            return
        row = self.head_dim * self.dtype.itemsize
        stage = np.ascontiguousarray(stage)
        runtime.copy_rows(self._device_address(0, 0, start), self.capacity * row, stage.ctypes.data, n * row,
                          n * row, self.n_layers * 2 * self.n_kv_heads, to_device=True)
        self.length = start + n

    def _device_rows(self, start: int, end: int) -> np.ndarray:
        """Rows [start, end) of every buffer, as a new host array [layers, 2, heads, n, head_dim]."""
        from engine.runtime.cuda_copy import cuda_runtime

        runtime = cuda_runtime()
        if runtime is None:
            return np.array(self.arena.numpy()[:, :, :, start:end, :])  # the whole cache comes across
        n, row = end - start, self.head_dim * self.dtype.itemsize
        out = np.empty((self.n_layers, 2, self.n_kv_heads, n, self.head_dim), self.dtype)
        runtime.copy_rows(out.ctypes.data, n * row, self._device_address(0, 0, start), self.capacity * row,
                          n * row, self.n_layers * 2 * self.n_kv_heads, to_device=False)
        return out

    # rows in and out ----------------------------------------------------------------------------
    def _copy_out(self, value, start: int, end: int) -> np.ndarray:
        return np.array(value.numpy()[:, :, start:end, :])  # .numpy() is a view on CPU: copy out

    def _copy_in(self, value, start: int, rows: np.ndarray) -> None:
        value.numpy()[:, :, start : start + rows.shape[2], :] = rows

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` rows; exact for causal attention (see the module docstring)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot cut a cache of {self.length} tokens to {length}")
        self.length = length

    def export(self, start: int = 0, end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Copies of rows [start, end): keys and values shaped [layers, kv_heads, n, head_dim]."""
        end = self.length if end is None else end
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"rows [{start}, {end}) are outside the {self.length} cached tokens")
        if self.on_device:
            rows = self._device_rows(start, end)
            return rows[:, 0], rows[:, 1]
        keys = np.stack([self._copy_out(v, start, end)[0] for v in self.keys])
        values = np.stack([self._copy_out(v, start, end)[0] for v in self.values])
        return keys, values

    def host_blocks(self, start: int, end: int) -> list[np.ndarray] | None:
        """Views of rows [start, end) in checkpoint order (layer; K then V; head), each [n, head_dim].

        Writable and contiguous, so checkpoint I/O moves rows without a staging copy. None when the
        buffers are not in host memory. Rows past ``length`` are scratch until ``commit``.
        """
        if self.device != "cpu":
            return None
        if not 0 <= start <= end <= self.capacity:
            raise ValueError(f"rows [{start}, {end}) are outside the buffer of {self.capacity}")
        blocks = []
        for i in range(self.n_layers):
            for buf in (self.keys[i], self.values[i]):
                arr = buf.numpy()
                blocks.extend(arr[0, h, start:end, :] for h in range(self.n_kv_heads))
        return blocks

    def commit(self, length: int) -> None:
        """Declare rows [0, length) valid after writing them through ``host_blocks``."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"cannot commit {length} rows in a buffer of {self.capacity}")
        self.length = length

    def load(self, keys: np.ndarray, values: np.ndarray, start: int = 0) -> None:
        """Write rows at ``start`` (keeping rows before it) and set the length to their end."""
        expected = (self.n_layers, self.n_kv_heads, keys.shape[2] if keys.ndim == 4 else -1, self.head_dim)
        if keys.shape != expected or values.shape != expected:
            raise ValueError(f"KV rows have shape {keys.shape}/{values.shape}, expected {expected}")
        if not 0 <= start <= self.length:
            raise ValueError(f"cannot write at row {start} of a cache holding {self.length}")
        end = start + keys.shape[2]
        self.reserve(end)
        if self.on_device:
            self._load_device(keys, values, start)
            return
        for i in range(self.n_layers):
            self._copy_in(self.keys[i], start, keys[i][None].astype(self.dtype, copy=False))
            self._copy_in(self.values[i], start, values[i][None].astype(self.dtype, copy=False))
        self.length = end

    def _load_device(self, keys: np.ndarray, values: np.ndarray, start: int) -> None:
        from engine.runtime.cuda_copy import cuda_runtime

        if cuda_runtime() is not None:
            stage = self.staging(keys.shape[2])
            stage[:, 0], stage[:, 1] = keys, values  # converting the dtype if it differs
            self.load_staged(stage, start)
            return
        # Without the runtime library: the whole cache out, patched, and back.
        full = self.arena.numpy()
        full[:, 0, :, start : start + keys.shape[2]] = keys
        full[:, 1, :, start : start + keys.shape[2]] = values
        self.arena.update_inplace(full)
        self.length = start + keys.shape[2]

    # the row protocol (kv_protocol.py): what checkpoint I/O uses ---------------------------------
    def _blocks_of(self, rows: np.ndarray) -> list[np.ndarray]:
        """The blocks of a [layers, 2, heads, n, head_dim] array, in checkpoint order."""
        return [rows[layer, kv, h] for layer in range(self.n_layers) for kv in (0, 1) for h in range(self.n_kv_heads)]

    def read_rows(self, start: int, end: int) -> list[np.ndarray]:
        """Rows [start, end) as blocks in checkpoint order: views of the buffers on the CPU (no copy;
        valid until the cache next changes), one strided copy of every layer from a GPU."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"rows [{start}, {end}) are outside the {self.length} cached tokens")
        if not self.on_device:
            return self.host_blocks(start, end)
        return self._blocks_of(self._device_rows(start, end))

    def write_rows(self, start: int, end: int, source: RowSource) -> int:
        """Replace rows [start, end) with what ``source`` fills and verifies; return the new length.

        Rows become visible only once verified, and no unverified row survives (see kv_protocol.py).
        The rows go wherever costs least: on the CPU straight into the buffers (no copy); on a GPU
        into a pinned staging array in the cache's order and dtype, moved in one strided copy for
        every layer; in another element type into a host array, converted in one copy per buffer.
        """
        if not 0 <= start <= self.length or end < start:
            raise ValueError(f"cannot write rows [{start}, {end}) into a cache of {self.length}")
        self.truncate(start)
        if start == 0:
            self.fit_for_overwrite(end)  # switching between long chats reuses the buffers as they are
        else:
            self.reserve(end)
        same = source.dtype is None or np.dtype(source.dtype) == self.dtype
        if same and not self.on_device:
            return self._write_in_place(start, end, source)
        if same:
            return self._write_staged(start, end, source)
        return self._write_converted(start, end, source, np.dtype(source.dtype))

    @staticmethod
    def _fill(source: RowSource, blocks: BlocksFn, start: int, end: int) -> int:
        """``source.fill`` with blocks of rows [start, end) only (committed rows are never handed out);
        where the verified rows end."""
        def within(s: int, e: int):
            if not start <= s <= e <= end:
                raise ValueError(f"a row source asked for rows [{s}, {e}) outside [{start}, {end})")
            return blocks(s, e)

        valid = source.fill(within)
        if not start <= valid <= end:
            raise ValueError(f"a row source verified up to {valid}, outside the rows [{start}, {end}) it filled")
        return valid

    def _write_in_place(self, start: int, end: int, source: RowSource) -> int:
        try:
            valid = self._fill(source, self.host_blocks, start, end)
        except BaseException:
            self.clear(start, end)
            raise
        if valid < end:
            self.clear(valid, end)  # no unverified bytes linger, even as scratch
        self.commit(valid)
        return valid

    def _write_staged(self, start: int, end: int, source: RowSource) -> int:
        stage = self.staging(end - start)  # its contents are scratch; only verified rows leave it
        valid = self._fill(source, lambda s, e: self._blocks_of(stage[:, :, :, s - start : e - start]), start, end)
        if valid > start:
            self.load_staged(stage[:, :, :, : valid - start], start)
        return valid

    def _write_converted(self, start: int, end: int, source: RowSource, dtype: np.dtype) -> int:
        shape = (self.n_layers, self.n_kv_heads, end - start, self.head_dim)
        keys, values = np.empty(shape, dtype), np.empty(shape, dtype)

        def blocks(s: int, e: int) -> list[np.ndarray]:
            return [arr[layer, h, s - start : e - start] for layer in range(self.n_layers) for arr in (keys, values)
                    for h in range(self.n_kv_heads)]

        valid = self._fill(source, blocks, start, end)
        if valid > start:
            self.load(keys[:, :, : valid - start], values[:, :, : valid - start], start)
        return valid


def _zeroed_on_device(shape, dtype: np.dtype):
    """A CUDA buffer of zeros. cudaMalloc'd memory holds whatever was there before, NaNs included, and the
    attention kernels read whole tiles past the valid rows: a masked-out weight of 0 times a NaN left in the
    cache is still NaN."""
    import onnxruntime as ort

    from engine.runtime.cuda_copy import cuda_runtime

    value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype.type, "cuda", 0)
    runtime = cuda_runtime()
    if runtime is not None:
        runtime.zero(value.data_ptr(), int(np.prod(shape)) * dtype.itemsize)
    else:
        value.update_inplace(np.zeros(shape, dtype))
    return value
