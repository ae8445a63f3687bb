"""``tessera quantize IN OUT TYPE``: requantize a GGUF model, like llama.cpp's llama-quantize.

Every 2-D (or stacked-experts 3-D) ``*.weight`` tensor is decoded from whatever type
tessera reads (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, FP8_E4M3 ...) and encoded as TYPE;
1-D tensors (norms, biases) and MoE routers are stored as F32; a tensor already in its
target type is copied byte for byte, as llama-quantize does. Without ``--pure`` the
quantized types follow llama.cpp's default mix (:func:`target_types`).
``general.file_type`` is set to llama.cpp's number for TYPE.

The output is written through :func:`tessera.files.gguf_writer.write_gguf` (a temporary file
renamed into place), so an error or Ctrl-C leaves no half-written OUT and never touches
IN, which the command refuses to overwrite (same path, or a link to it).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.files.gguf_writer import F32_TENSORS, FLOAT_TYPES, QUANTIZATION_VERSION, write_gguf
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

#: TYPE argument -> (quant type name, ``general.file_type``). q4_k is llama.cpp's Q4_K_M
#: (file type 15, what ``llama-quantize ... Q4_K`` writes); fp8_e4m3's number is tessera's.
TARGETS: dict[str, tuple[str, int]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
    "q4_k": ("Q4_K", 15),
    "q6_k": ("Q6_K", 18),
    "fp8_e4m3": ("FP8_E4M3", 200),
}
#: llama.cpp's fallback for a tensor whose rows do not fill the type's blocks; when that
#: type is not installed (or does not fit either), Q8_0 and then F16 are tried.
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0", "Q4_0": "Q8_0"}
#: Types whose output head stays as it is in the default mix (8-bit already).
HEAD_KEEPS = {"Q8_0", "FP8_E4M3"}


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of layers that get more bits in the *_M mixes."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


def default_type(name: str, target: str, n_layer: int, head: str) -> str:
    """The type llama.cpp's default mix gives a quantizable tensor for target ``target``.

    The output head (``output.weight``, or ``token_embd.weight`` when the embeddings are
    tied) gets Q6_K unless the target is 8-bit already; for Q4_K (Q4_K_M) ``attn_v`` and
    ``ffn_down`` of the layers :func:`use_more_bits` picks get Q6_K.
    """
    if target in FLOAT_TYPES.values():
        return target
    if name == head:
        return target if target in HEAD_KEEPS else "Q6_K"
    layer = _layer(name)
    if target == "Q4_K" and layer is not None and use_more_bits(layer, n_layer):
        if name.endswith((".attn_v.weight", ".ffn_down.weight")):
            return "Q6_K"
    return target


def target_types(
    shapes: Mapping[str, tuple[int, ...]],
    target: str,
    lookup: Callable[[str], Any],
    *,
    pure: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """The quant type each tensor gets when a model is quantized to ``target``, and the
    tensors that fell back to another type.

    1-D tensors, norms, MoE routers (``ffn_gate_inp``, never quantized by llama-quantize)
    and anything that is not a ``.weight`` get F32; other tensors get
    ``target`` (``pure``) or llama.cpp's default mix (:func:`default_type`); a tensor whose
    rows do not fill its type's blocks falls back as llama.cpp does (:data:`FALLBACK`), then
    to Q8_0, then F16. ``lookup(name)`` returns the installed QuantType called ``name``.
    """
    layers = [n for n in map(_layer, shapes) if n is not None]
    n_layer = max(layers) + 1 if layers else 0
    head = "output.weight" if "output.weight" in shapes else "token_embd.weight"
    types: dict[str, Any] = {}
    fallbacks: list[str] = []
    for name, shape in shapes.items():
        if len(shape) < 2 or name.endswith(F32_TENSORS) or not name.endswith(".weight"):
            types[name] = lookup("F32")
            continue
        wanted = target if pure else default_type(name, target, n_layer, head)
        types[name] = _fitting(wanted, shape[-1], lookup)
        if types[name].name != wanted:
            fallbacks.append(name)
    return types, fallbacks


def _fitting(name: str, n_cols: int, lookup: Callable[[str], Any]) -> Any:
    for candidate in (name, FALLBACK.get(name), "Q8_0", "F16"):
        if candidate is None:
            continue
        try:
            qtype = lookup(candidate)
        except TesseraError:
            continue
        if n_cols % qtype.block_size == 0:
            return qtype
    return lookup("F32")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def quantize_model(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    target: str,
    runtime: Any,
    *,
    pure: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``src`` requantized to ``target`` (a :data:`TARGETS` key) to ``dst``.

    Returns ``{"types": {tensor: type name}, "fallbacks": [tensor, ...]}``. Raises
    :class:`TesseraError` (writing nothing) for an unknown target, a missing or bad
    ``src``, a ``dst`` that is ``src`` itself, a folder, or in a folder that does not exist.
    """
    from tessera.files.gguf import RawTensor, read_gguf
    from tessera.files.load import stored_tensor

    key = target.lower()
    if key not in TARGETS:
        raise TesseraError(f"unknown quant type '{target}'; choose one of: {', '.join(TARGETS)}")
    target_name, file_type = TARGETS[key]
    runtime.quant_type_by_name(target_name)  # fail early if its plugin is missing
    src, dst = Path(src), Path(dst)
    if _same_file(src, dst):
        raise TesseraError(
            f"output '{dst}' is the input file; quantize into a new file (the input is kept)"
        )
    if dst.is_dir():
        raise TesseraError(f"output '{dst}' is a folder; pass the path of the file to write")
    if not dst.parent.is_dir():  # as llama-quantize: a mistyped folder is not created
        raise TesseraError(
            f"output folder '{dst.parent}' does not exist; create it first or write elsewhere"
        )
    gguf = read_gguf(src)
    if not gguf.architecture:
        raise TesseraError(f"'{src}' has no general.architecture key; pass a model file")
    shapes = {name: t.shape for name, t in gguf.tensors.items()}
    types, fallbacks = target_types(shapes, target_name, runtime.quant_type_by_name, pure=pure)
    items = list(gguf.tensors.items())
    if progress:
        from tqdm import tqdm

        items = tqdm(items, desc=f"quantizing to {key}", unit="tensor")
    tensors = []
    for name, raw in items:
        source_type = runtime.quant_type(raw.ggml_type, name)
        raw = stored_tensor(raw, source_type)
        qtype = types[name]
        if source_type is qtype:
            tensors.append(raw)
            continue
        values = source_type.dequantize_tensor(raw.data, raw.shape)
        data = qtype.quantize_tensor(values)
        tensors.append(RawTensor(name, int(qtype.ggml_type), raw.shape, data))
    metadata = dict(gguf.metadata)
    metadata["general.file_type"] = file_type
    metadata.pop("general.quantization_version", None)
    if any(t.ggml_type not in FLOAT_TYPES for t in tensors):
        metadata["general.quantization_version"] = QUANTIZATION_VERSION
    write_gguf(dst, metadata, tensors)
    return {"types": {n: q.name for n, q in types.items()}, "fallbacks": fallbacks}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="IN.gguf", help="model file to quantize")
    parser.add_argument("outfile", metavar="OUT.gguf", help="file to write (not IN)")
    parser.add_argument("type", metavar="TYPE", help=f"target type: {', '.join(TARGETS)}")
    parser.add_argument(
        "--pure",
        action="store_true",
        help="every 2-D weight gets TYPE (no Q6_K output head or Q4_K_M mix), as llama.cpp",
    )


def run(args: argparse.Namespace, runtime: Any) -> int:
    src = Path(args.model)
    result = quantize_model(src, args.outfile, args.type, runtime, pure=args.pure, progress=True)
    before = src.stat().st_size / 2**20
    after = Path(args.outfile).stat().st_size / 2**20
    counts: dict[str, int] = {}
    for name in result["types"].values():
        counts[name] = counts.get(name, 0) + 1
    mix = ", ".join(f"{n} x{c}" for n, c in sorted(counts.items()))
    print(f"model size = {before:.2f} MiB, quant size = {after:.2f} MiB ({args.type.lower()})")
    print(f"tensor types: {mix}")
    if result["fallbacks"]:
        print(
            f"{len(result['fallbacks'])} tensors fell back to another type: their rows do "
            "not fill the type's blocks"
        )
    print(f"wrote {args.outfile}")
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command(
            "quantize",
            "requantize a GGUF model to another type (like llama-quantize)",
            add_arguments,
            run,
        )
    )
