"""``tessera quantize IN OUT TYPE``: requantize a GGUF model, like llama.cpp's llama-quantize.

TYPE is one of llama-quantize's file type names (Q4_K_M, Q3_K_S, IQ4_XS, MXFP4_MOE ...,
case-insensitive; :data:`~tessera.plugins.cmd.quantize_types.FILE_TYPES`). Each tensor gets
the type llama-quantize would give it (:func:`~tessera.plugins.cmd.quantize_mix.choose_types`:
the file type's mix, or with ``--pure`` the file type's own type; the fallback for rows that
do not fill a type's blocks either way), is decoded from whatever type tessera reads and
encoded as that type; tensors llama-quantize never quantizes (1-D ones, norms, MoE routers)
and a tensor already in its type are copied byte for byte. A file type whose chosen types
are not all installed is refused before anything is written. ``general.file_type`` is set
to llama.cpp's number for TYPE.

The output is written through :func:`tessera.files.gguf_writer.write_gguf` (a temporary file
renamed into place), so an error or Ctrl-C leaves no half-written OUT and never touches
IN, which the command refuses to overwrite (same path, or a link to it).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tessera.contract.commands import Command
from tessera.errors import TesseraError, UnknownQuantTypeError
from tessera.files.gguf_writer import FLOAT_TYPES, QUANTIZATION_VERSION, write_gguf
from tessera.hookspecs import hookimpl
from tessera.plugins.cmd.quantize_mix import Mix, choose_types
from tessera.plugins.cmd.quantize_types import ALIASES, FILE_TYPES, file_type

TESSERA_PLUGIN_API = 2


def _missing_types(mix: Mix, stored: Mapping[str, str], runtime: Any) -> list[str]:
    """The chosen types no installed plugin can write (a tensor kept as stored needs none)."""
    missing = set()
    for name, qtype in mix.types.items():
        if qtype.upper() == stored[name].upper():
            continue
        try:
            runtime.quant_type_by_name(qtype)
        except UnknownQuantTypeError:
            missing.add(qtype)
    return sorted(missing)


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
    """Write ``src`` requantized to file type ``target`` (a llama-quantize name) to ``dst``.

    Returns ``{"types": {tensor: type name}, "fallbacks": [tensor, ...]}``. Raises
    :class:`TesseraError` (writing nothing) for an unknown target, a type it needs that
    no plugin provides, a missing or bad ``src``, a ``dst`` that is ``src`` itself, a
    folder, or in a folder that does not exist.
    """
    from tessera.files.gguf import RawTensor, read_gguf
    from tessera.files.load import stored_tensor

    ftype = file_type(target)
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
    stored = {name: runtime.quant_type(t.ggml_type, name).name for name, t in gguf.tensors.items()}
    triples = [(name, tuple(t.shape), stored[name]) for name, t in gguf.tensors.items()]
    mix = choose_types(triples, gguf.metadata, ftype, pure=pure)
    missing = _missing_types(mix, stored, runtime)
    if missing:
        raise TesseraError(
            f"{ftype.name} needs quant type {', '.join(missing)}, which no installed plugin "
            "provides; install the plugin that registers it or choose another type"
        )
    items = list(gguf.tensors.items())
    if progress:
        from tessera.progress_bar import progress as bar

        items = bar(items, f"quantizing to {ftype.name}", total=len(gguf.tensors))
    tensors = []
    for name, raw in items:
        source_type = runtime.quant_type(raw.ggml_type, name)
        raw = stored_tensor(raw, source_type)
        qtype = runtime.quant_type_by_name(mix.types[name])
        if source_type is qtype:
            tensors.append(raw)
            continue
        values = source_type.dequantize_tensor(raw.data, raw.shape)
        data = qtype.quantize_tensor(values)
        tensors.append(RawTensor(name, int(qtype.ggml_type), raw.shape, data))
    metadata = dict(gguf.metadata)
    metadata["general.file_type"] = ftype.number
    metadata.pop("general.quantization_version", None)
    if any(t.ggml_type not in FLOAT_TYPES for t in tensors):
        metadata["general.quantization_version"] = QUANTIZATION_VERSION
    write_gguf(dst, metadata, tensors)
    return {"types": mix.types, "fallbacks": mix.fallbacks}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="IN.gguf", help="model file to quantize")
    parser.add_argument("outfile", metavar="OUT.gguf", help="file to write (not IN)")
    names = ", ".join([*FILE_TYPES, *ALIASES])
    parser.add_argument("type", metavar="TYPE", help=f"llama-quantize's file type: {names}")
    parser.add_argument(
        "--pure",
        action="store_true",
        help="every quantized tensor gets TYPE's own type (no mix), as llama-quantize --pure",
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
    name = file_type(args.type).name
    print(f"model size = {before:.2f} MiB, quant size = {after:.2f} MiB ({name})")
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
