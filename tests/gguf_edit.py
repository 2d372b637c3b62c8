"""Copy a GGUF with tensors dropped or added, to make damaged or unusual models for tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def rewrite_gguf(src: Path, dst: Path, drop: tuple[str, ...] = (), add: dict | None = None,
                 values: dict | None = None, new_values: dict | None = None) -> Path:
    """``drop`` names tensors or metadata keys to leave out; ``add`` maps tensor names to (raw bytes array,
    GGMLQuantizationType); ``values`` replaces metadata values (scalars keep their types; arrays are
    written as given); ``new_values`` adds metadata: key → (value, GGUFValueType)."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, (values or {}).get(key, field.contents()))
        else:
            writer.add_key_value(key, (values or {}).get(key, field.contents()), field.types[0])
    for key, (value, kind) in (new_values or {}).items():
        writer.add_key_value(key, value, kind)
    for t in reader.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for name, (data, qtype) in (add or {}).items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
