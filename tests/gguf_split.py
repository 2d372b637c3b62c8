"""Split a GGUF as llama.cpp's ``gguf-split`` does, to test split models: ``STEM-00001-of-0000N.gguf``...,
every part with ``split.no`` (u16, 0-based), ``split.count`` (u16) and ``split.tensors.count`` (i32), the
first part holding the model's metadata, the tensors shared out in order. Written with the ``gguf``
library's writer (not the engine's code, which joins them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def split_gguf(src: Path, out_dir: Path, parts: int, stem: str | None = None) -> list[Path]:
    import gguf

    reader = gguf.GGUFReader(src)
    tensors = list(reader.tensors)
    assert 1 < parts <= len(tensors)
    arch = reader.fields["general.architecture"].contents()
    stem = stem or src.stem
    per = -(-len(tensors) // parts)
    written = []
    for n in range(parts):
        path = out_dir / f"{stem}-{n + 1:05d}-of-{parts:05d}.gguf"
        writer = gguf.GGUFWriter(str(path), arch)
        if n == 0:
            for key, field in reader.fields.items():
                if key.startswith("GGUF.") or key == "general.architecture":
                    continue
                if field.types[0] == gguf.GGUFValueType.ARRAY:
                    writer.add_array(key, field.contents())
                else:
                    writer.add_key_value(key, field.contents(), field.types[0])
        writer.add_uint16("split.no", n)
        writer.add_uint16("split.count", parts)
        writer.add_int32("split.tensors.count", len(tensors))
        for t in tensors[n * per:(n + 1) * per]:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        written.append(path)
    return written
