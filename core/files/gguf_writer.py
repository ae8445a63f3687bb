"""Writing GGUF files the way llama.cpp's converter writes them.

:func:`write_gguf` maps plain Python metadata values onto GGUF value types as
``convert_hf_to_gguf.py`` does (scalar ints as UINT32, int arrays as INT32, floats as
FLOAT32 ...), fills in the ``general.*`` keys llama.cpp expects, and writes through the
``gguf`` package's :class:`gguf.GGUFWriter` into a temporary file that is renamed over
``path`` only once it is complete: a failure never leaves a half-written file and never
touches a good file already at ``path``.

:func:`storage_types` is llama.cpp's rule for which type each tensor gets for a given
output type (1-D tensors and norms stay F32, rows that do not fit the type's blocks fall
back to F16), shared by ``tessera convert`` and the test-model maker.
"""

from __future__ import annotations

import collections
import numbers
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.errors import TesseraError
from tessera.files.gguf import RawTensor

#: GGML type ids of the unquantized float types (F32, F16, BF16).
FLOAT_TYPES = {0: "F32", 1: "F16", 30: "BF16"}
#: llama.cpp's ``LlamaFileType`` number for a file made "mostly" of one GGML type.
FILE_TYPE_OF_GGML_TYPE = {0: 0, 1: 1, 2: 2, 3: 3, 6: 8, 7: 9, 8: 7, 30: 32}
#: ``general.quantization_version`` llama.cpp writes (GGML_QNT_VERSION).
QUANTIZATION_VERSION = 2
DEFAULT_ALIGNMENT = 32


@attrs.frozen
class TypedValue:
    """A metadata value with an explicit GGUF type, for keys the default mapping gets wrong.

    ``value_type`` and ``item_type`` are :class:`gguf.GGUFValueType` members (``item_type``
    only for arrays), e.g. ``TypedValue([1, 2], GGUFValueType.ARRAY, GGUFValueType.UINT32)``.
    """

    value: Any
    value_type: Any
    item_type: Any = None


def value_type_of(value: Any) -> tuple[Any, Any]:
    """The GGUF ``(type, item type)`` llama.cpp's converter uses for a Python value.

    Scalars: bool -> BOOL, int -> UINT32 (INT32 if negative, 64-bit if it does not fit),
    float -> FLOAT32, str -> STRING. Lists: of str -> STRING, of bool -> BOOL, of int ->
    INT32 (as ``tokenizer.ggml.token_type``), of numbers with a float -> FLOAT32.
    """
    from gguf import GGUFValueType as V

    if isinstance(value, TypedValue):
        return value.value_type, value.item_type
    if isinstance(value, (bool, np.bool_)):
        return V.BOOL, None
    if isinstance(value, numbers.Integral):
        v = int(value)
        if 0 <= v < 2**32:
            return V.UINT32, None
        if -(2**31) <= v < 0:
            return V.INT32, None
        return (V.UINT64 if v > 0 else V.INT64), None
    if isinstance(value, numbers.Real):
        return V.FLOAT32, None
    if isinstance(value, str):
        return V.STRING, None
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if all(isinstance(i, str) for i in items):
            return V.ARRAY, V.STRING
        if all(isinstance(i, (bool, np.bool_)) for i in items):
            return V.ARRAY, V.BOOL
        if all(isinstance(i, numbers.Integral) for i in items):
            return V.ARRAY, V.INT32
        if all(isinstance(i, numbers.Real) for i in items):
            return V.ARRAY, V.FLOAT32
    raise TypeError(
        f"cannot store {type(value).__name__} value {value!r:.60} in GGUF metadata; use "
        "str, int, float, bool, a flat list of one of them, or TypedValue"
    )


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as the Python values gguf-py packs."""
    if isinstance(value, TypedValue):
        value = value.value
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def guess_file_type(tensors: Iterable[RawTensor]) -> int:
    """``general.file_type`` as llama.cpp guesses it: the GGML type most tensors have.

    Only 2-D (and larger) tensors count, since 1-D ones stay F32 in every file type.
    """
    counts = collections.Counter(t.ggml_type for t in tensors if len(t.shape) >= 2)
    if not counts:
        return 0
    ggml_type = counts.most_common(1)[0][0]
    return FILE_TYPE_OF_GGML_TYPE.get(ggml_type, 1024)  # 1024: LlamaFileType.GUESSED


def write_gguf(
    path: str | os.PathLike[str],
    metadata: Mapping[str, Any],
    tensors: Iterable[RawTensor],
    *,
    alignment: int | None = None,
) -> Path:
    """Write a GGUF file atomically; return its path.

    ``metadata`` must hold ``general.architecture``; its values are typed by
    :func:`value_type_of` (empty lists are left out, as llama.cpp's writer does).
    ``general.file_type`` is guessed from the tensors when absent, and
    ``general.quantization_version`` is added when any tensor is quantized. ``tensors``
    are :class:`RawTensor` objects already in their GGML storage type, written in order.
    ``alignment`` (or a ``general.alignment`` key) sets the tensor data alignment.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    path = Path(path)
    tensors = list(tensors)
    meta = dict(metadata)
    arch = meta.pop("general.architecture", None)
    if not arch:
        raise ValueError("GGUF metadata needs general.architecture")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"tensor '{dup}' is given twice")
    meta.setdefault("general.file_type", guess_file_type(tensors))
    if any(t.ggml_type not in FLOAT_TYPES for t in tensors):
        meta.setdefault("general.quantization_version", QUANTIZATION_VERSION)
    alignment = int(alignment or _plain(meta.pop("general.alignment", DEFAULT_ALIGNMENT)))

    writer = GGUFWriter(None, str(arch))
    if alignment != DEFAULT_ALIGNMENT:
        writer.add_custom_alignment(alignment)
    for key, value in meta.items():
        value_type, item_type = value_type_of(value)
        plain = _plain(value)
        if isinstance(plain, list) and not plain:
            continue
        writer.add_key_value(key, plain, value_type, item_type)
    for t in tensors:
        data = np.ascontiguousarray(t.data).view(np.uint8).reshape(-1)
        try:
            ggml_type: Any = GGMLQuantizationType(t.ggml_type)
        except ValueError:
            ggml_type = t.ggml_type  # a plugin's type gguf-py does not know: written as a number
        else:
            _check_size(t, data.nbytes, GGML_QUANT_SIZES[ggml_type])
        # Pass the logical shape with a non-uint8 dtype so gguf-py keeps it as given.
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), data.nbytes, ggml_type)

    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh name next to the target (same file system, so the rename is atomic); the
    # writer creates it, so it gets the usual permissions, not mkstemp's 0600.
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        writer.write_header_to_file(path=tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            writer.write_tensor_data(np.ascontiguousarray(t.data).view(np.uint8).reshape(-1))
        for f in writer.fout or []:
            f.flush()
            os.fsync(f.fileno())
        writer.close()
        os.replace(tmp, path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return path


def _check_size(t: RawTensor, nbytes: int, block: tuple[int, int]) -> None:
    block_size, type_size = block
    n = t.n_elements
    if n % block_size or n // block_size * type_size != nbytes:
        raise ValueError(
            f"tensor '{t.name}' has {nbytes} bytes, which do not hold shape {t.shape} in "
            f"GGML type {t.ggml_type}"
        )


#: Weights llama.cpp's converter always keeps in F32: norms and MoE routers.
F32_TENSORS = ("_norm.weight", "ffn_gate_inp.weight")


def storage_types(
    shapes: Mapping[str, tuple[int, ...]], outtype: str, lookup: Callable[[str], Any]
) -> dict[str, Any]:
    """The quant type each tensor is stored in for output type ``outtype``, as llama.cpp does.

    ``convert_hf_to_gguf.py``'s rules: 1-D tensors, norms, MoE routers and anything that is
    not a ``.weight`` stay F32; every other tensor gets ``outtype``; a tensor whose rows do not
    fill ``outtype``'s blocks falls back to F16. For Q4_0 (made by ``llama-quantize`` in
    llama.cpp) the output head (``output.weight``, or ``token_embd.weight`` when tied) gets
    Q6_K where a Q6_K type is installed and rows fit its blocks, otherwise Q8_0.
    ``lookup(name)`` returns the installed :class:`~tessera.contract.quant.QuantType` called
    ``name``.
    """
    main = lookup(outtype)
    head = "output.weight" if "output.weight" in shapes else "token_embd.weight"
    types: dict[str, Any] = {}
    for name, shape in shapes.items():
        qtype = main
        if len(shape) <= 1 or name.endswith(F32_TENSORS) or not name.endswith(".weight"):
            qtype = lookup("F32")
        elif name == head and main.name.upper() == "Q4_0":
            qtype = _head_type(shape[-1], lookup)
        if len(shape) and shape[-1] % qtype.block_size:
            qtype = lookup("F16")
        types[name] = qtype
    return types


def _head_type(row: int, lookup: Callable[[str], Any]) -> Any:
    try:
        q6_k = lookup("Q6_K")
    except TesseraError:
        return lookup("Q8_0")
    return q6_k if row % q6_k.block_size == 0 else lookup("Q8_0")


def encode_tensor(name: str, values: np.ndarray, qtype: Any) -> RawTensor:
    """``values`` (float, numpy order) stored as ``qtype``, as a :class:`RawTensor`."""
    values = np.asarray(values)
    data = qtype.quantize_tensor(values.astype(np.float32, copy=False))
    return RawTensor(name, int(qtype.ggml_type), tuple(int(n) for n in values.shape), data)
