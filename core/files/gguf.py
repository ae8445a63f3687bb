"""Reading GGUF files: metadata as plain Python values and tensors as memory-mapped bytes.

The container is parsed here, straight from one read-only ``np.memmap`` of the file:
header (magic, version 2 or 3, tensor and KV counts), the KV pairs, the tensor infos,
then the data section at the next multiple of ``general.alignment`` (default 32). The
``gguf`` package supplies the constants (value types, bytes per block of each GGML type).
String arrays are decoded in one tight loop over the mapped bytes; ``gguf.GGUFReader``
builds numpy views per string and takes many seconds on a 128k-token vocabulary.

Every way a file can be bad becomes one :class:`~tessera.errors.ModelFileError` sentence.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


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
        return int(np.prod(self.shape))  # () -> 1


@attrs.frozen
class GGUFFile:
    """A parsed GGUF file: its metadata (key -> Python value) and its tensors by name."""

    path: Path
    metadata: Mapping[str, Any]
    tensors: Mapping[str, RawTensor]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Corrupt(Exception):
    """Internal: the bytes do not form a GGUF file; the message says where."""


def _numeric_types() -> dict[int, np.dtype]:
    """Little-endian numpy dtype of each fixed-size GGUF value type."""
    from gguf import GGUFValueType as V

    codes = {
        V.UINT8: "u1", V.INT8: "i1", V.UINT16: "<u2", V.INT16: "<i2",
        V.UINT32: "<u4", V.INT32: "<i4", V.UINT64: "<u8", V.INT64: "<i8",
        V.FLOAT32: "<f4", V.FLOAT64: "<f8", V.BOOL: "?",
    }  # fmt: skip
    return {int(t): np.dtype(code) for t, code in codes.items()}


class _Cursor:
    """Reads GGUF values from a buffer, moving forward; raises _Corrupt past its end."""

    def __init__(self, buf: memoryview) -> None:
        from gguf import GGUFValueType

        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.numeric = _numeric_types()
        self.string_type = int(GGUFValueType.STRING)
        self.array_type = int(GGUFValueType.ARRAY)

    def _need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise _Corrupt(f"{what} at byte {self.pos} runs past the end of the file")

    def _int(self, fmt: struct.Struct, what: str) -> int:
        self._need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def u32(self, what: str) -> int:
        return self._int(_U32, what)

    def u64(self, what: str) -> int:
        return self._int(_U64, what)

    def name(self, what: str) -> str:
        """A key or tensor name: a string that must be valid UTF-8."""
        n = self.u64(what)
        self._need(n, what)
        try:
            text = str(self.buf[self.pos : self.pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise _Corrupt(f"{what} at byte {self.pos} is not UTF-8") from exc
        self.pos += n
        return text

    def value(self, value_type: int, what: str) -> Any:
        """One value of ``value_type``: a Python scalar, str, or (nested) list."""
        if value_type == self.array_type:
            item_type = self.u32(what)
            return self.array(item_type, self.u64(what), what)
        return self.array(value_type, 1, what)[0]

    def array(self, item_type: int, count: int, what: str) -> list[Any]:
        dtype = self.numeric.get(item_type)
        if dtype is not None:
            self._need(count * dtype.itemsize, what)
            values = np.frombuffer(self.buf, dtype, count, self.pos)
            self.pos += count * dtype.itemsize
            # tolist() gives Python int / float (float32 widened exactly) / bool
            return values.tolist()
        if item_type == self.string_type:
            return self.strings(count, what)
        if item_type == self.array_type:
            return [self.value(item_type, what) for _ in range(count)]
        raise _Corrupt(f"{what} has unknown value type {item_type}")

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings (u64 length + bytes each), decoded in one tight loop."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):
            if pos + 8 > size:
                break
            (n,) = unpack(buf, pos)
            pos += 8
            end = pos + n
            if end > size:
                break
            append(str(buf[pos:end], "utf-8", "replace"))
            pos = end
        else:
            self.pos = pos
            return out
        raise _Corrupt(f"string {len(out)} of {what} runs past the end of the file")


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
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        fix = "make it readable (chmod a+r)" if isinstance(exc, PermissionError) else "check it"
        raise ModelFileError(
            f"cannot read model file '{path}' ({exc.strerror or exc}); {fix} or pass another file"
        ) from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"'{path}' is not a GGUF file (it does not start with the GGUF magic bytes); "
            "convert it with `tessera convert` or pass a .gguf file"
        )


def _read_version(path: Path, cur: _Cursor) -> None:
    cur.pos = len(GGUF_MAGIC)
    version = cur.u32("the version")
    # A big-endian writer puts a small version number in the high bytes.
    if version & 0xFFFF == 0 and version >> 16:
        raise ModelFileError(
            f"'{path}' is a big-endian GGUF file, which tessera does not read; "
            "convert the model again to a little-endian GGUF"
        )
    if version not in SUPPORTED_VERSIONS:
        raise ModelFileError(
            f"'{path}' is GGUF version {version}, but tessera reads versions "
            f"{' and '.join(map(str, SUPPORTED_VERSIONS))}; convert the model again"
        )


def _read_metadata(cur: _Cursor, kv_count: int) -> tuple[dict[str, Any], int]:
    """The KV pairs, and the data alignment they set."""
    from gguf import GGUFValueType

    metadata: dict[str, Any] = {}
    alignment = DEFAULT_ALIGNMENT
    for i in range(kv_count):
        key = cur.name(f"metadata key {i}")
        if key in metadata:
            raise _Corrupt(f"metadata key '{key}' appears twice")
        value_type = cur.u32(f"the type of '{key}'")
        metadata[key] = cur.value(value_type, f"'{key}'")
        if key == "general.alignment":
            alignment = metadata[key]
            if value_type != GGUFValueType.UINT32 or alignment <= 0 or alignment & (alignment - 1):
                raise _Corrupt(f"general.alignment must be a power-of-two uint32, got {alignment}")
    return metadata, alignment


def _read_tensor_infos(cur: _Cursor, tensor_count: int) -> list[tuple[str, int, tuple, int]]:
    """``(name, ggml_type, shape in numpy order, offset in the data section)`` per tensor."""
    from gguf import GGUFValueType

    infos = []
    names: set[str] = set()
    for i in range(tensor_count):
        name = cur.name(f"the name of tensor {i}")
        if name in names:
            raise _Corrupt(f"tensor '{name}' appears twice")
        names.add(name)
        n_dims = cur.u32(f"the rank of '{name}'")
        ne = cur.array(int(GGUFValueType.UINT64), n_dims, f"the shape of '{name}'")
        ggml_type = cur.u32(f"the type of '{name}'")
        offset = cur.u64(f"the offset of '{name}'")
        infos.append((name, ggml_type, tuple(reversed(ne)), offset))
    return infos


def _tensor_ends(path: Path, infos: list, data_start: int, size: int) -> list[int]:
    """The file offset where each tensor's bytes end.

    Known GGML types end after ``n_elements / block_size * type_size`` bytes. A type id
    the ``gguf`` package does not know gets the bytes up to the next tensor's start (or the
    end of the file), so the loader can name the unknown type instead of the reader failing.
    """
    from gguf import GGML_QUANT_SIZES

    starts = sorted({data_start + offset for *_, offset in infos} | {size})
    ends = []
    for name, ggml_type, shape, offset in infos:
        start = data_start + offset
        if ggml_type in GGML_QUANT_SIZES:
            block_size, type_size = GGML_QUANT_SIZES[ggml_type]
            end = start + int(np.prod(shape, dtype=object)) * type_size // block_size
        else:
            later = bisect.bisect_right(starts, start)
            end = starts[later] if later < len(starts) else start
        if end > size:
            raise ModelFileError(
                f"'{path}' is truncated: tensor '{name}' needs bytes up to {end} but the "
                f"file has {size}; download or convert it again"
            )
        ends.append(end)
    return ends


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file with memory mapping; raise ModelFileError if it is missing or bad.

    Metadata values are Python ``int`` / ``float`` (FLOAT32 widened exactly) / ``bool`` /
    ``str`` or lists of them; an array of arrays stays a list of lists. Big-endian files
    are refused. A tensor of a GGML type the ``gguf`` package does not know is read up to
    the next tensor's start or the file's end (:func:`_tensor_ends`); the loader names it.
    """
    path = Path(path)
    _check_header(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mapped))
    try:
        _read_version(path, cur)
        tensor_count = cur.u64("the tensor count")
        kv_count = cur.u64("the metadata count")
        metadata, alignment = _read_metadata(cur, kv_count)
        infos = _read_tensor_infos(cur, tensor_count)
    except _Corrupt as exc:
        raise ModelFileError(
            f"'{path}' is truncated or corrupt ({exc}); download or convert it again"
        ) from exc
    data_start = -(-cur.pos // alignment) * alignment
    ends = _tensor_ends(path, infos, data_start, cur.size)
    tensors = {
        name: RawTensor(name, ggml_type, shape, np.asarray(mapped[data_start + offset : end]))
        for (name, ggml_type, shape, offset), end in zip(infos, ends, strict=True)
    }
    return GGUFFile(path, metadata, tensors)
