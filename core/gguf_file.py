"""Reading GGUF files: metadata as plain Python values and tensors as memory-mapped bytes.

The container format is parsed by the ``gguf`` package; this module turns its reader into
plain data (:class:`RawTensor`, a metadata dict) and turns every way a file can be bad
into one :class:`~tessera.errors.ModelFileError` sentence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.errors import ModelFileError

GGUF_MAGIC = b"GGUF"


@attrs.frozen
class RawTensor:
    """One tensor as stored in a model file: its GGML type and its bytes, not yet decoded.

    ``shape`` is in numpy order (rows first): a weight of ``n_out`` rows of ``n_in``
    values has shape ``(n_out, n_in)``, which GGUF writes as ``ne = [n_in, n_out]``.
    ``data`` is a flat ``uint8`` array (usually a view of the memory-mapped file).
    """

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray = attrs.field(eq=False, repr=False)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


@attrs.frozen
class GGUFFile:
    """A parsed GGUF file: its metadata (key -> Python value) and its tensors by name."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, RawTensor]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def _field_value(field: Any) -> Any:
    """Decode one reader field into str / int / float / bool or a list of them."""
    from gguf import GGUFValueType

    types = field.types
    if not types:
        return None
    if types[0] == GGUFValueType.ARRAY:
        item_type = types[-1]
        parts = [field.parts[i] for i in field.data]
        if item_type == GGUFValueType.STRING:
            return [bytes(p).decode("utf-8", errors="replace") for p in parts]
        if not parts:
            return []
        values = np.concatenate([np.asarray(p).reshape(-1) for p in parts])
        return values.tolist()
    value = field.parts[field.data[0]]
    if types[0] == GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    scalar = np.asarray(value).reshape(-1)[0]
    if types[0] == GGUFValueType.BOOL:
        return bool(scalar)
    return scalar.item()


def _check_header(path: Path) -> None:
    if not path.exists():
        raise ModelFileError(
            f"model file '{path}' does not exist; pass -m with the path of a .gguf file"
        )
    if path.is_dir():
        raise ModelFileError(
            f"'{path}' is a folder without config.json; pass -m with a .gguf file or a "
            "Hugging Face model folder"
        )
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"'{path}' is not a GGUF file (it does not start with the GGUF magic bytes); "
            "convert it with `tessera convert` or pass a .gguf file"
        )


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file with memory mapping; raise ModelFileError if it is missing or bad."""
    from gguf import GGUFReader

    path = Path(path)
    _check_header(path)
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # the reader raises many kinds for a cut or damaged file
        raise ModelFileError(
            f"'{path}' is truncated or corrupt ({exc}); download or convert it again"
        ) from exc
    size = path.stat().st_size
    # The reader lists the header counts as pseudo-keys "GGUF.*"; they are not metadata.
    metadata = {
        name: _field_value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
    tensors: dict[str, RawTensor] = {}
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise ModelFileError(
                f"'{path}' is truncated: tensor '{t.name}' needs bytes up to {end} but the "
                f"file has {size}; download or convert it again"
            )
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        data = np.asarray(t.data).reshape(-1).view(np.uint8)
        tensors[t.name] = RawTensor(t.name, int(t.tensor_type), shape, data)
    return GGUFFile(path, metadata, tensors)
