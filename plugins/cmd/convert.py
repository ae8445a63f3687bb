"""``tessera convert``: a Hugging Face safetensors folder to GGUF, as llama.cpp lays it out.

The output matches what llama.cpp's ``convert_hf_to_gguf.py`` writes for the same model:
the architecture plugin supplies the metadata keys, the GGUF tensor names and any
layout change llama.cpp makes (the ``llama`` arch's Q/K row permutation), the tokenizer
supplies llama.cpp's ``tokenizer.*`` keys and the chat template, and
:func:`tessera.files.gguf_writer.storage_types` picks each tensor's type the way llama.cpp does.
``q4_0`` is not a converter outtype in llama.cpp; here it follows ``llama-quantize``.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tessera.contract.commands import Command
from tessera.errors import ModelFileError, TesseraError
from tessera.files.gguf_writer import QUANTIZATION_VERSION, encode_tensor, storage_types, write_gguf
from tessera.files.hf import read_hf_config, read_safetensors_dir
from tessera.files.model_names import resolve_model_path
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2

log = logging.getLogger("tessera.convert")

#: ``--outtype`` -> (quant type name, llama.cpp ``LlamaFileType`` number).
OUTTYPES: dict[str, tuple[str, int]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
}


def chat_template(hf_dir: Path) -> str | None:
    """The default chat template of an HF folder (``chat_template.jinja`` or the config)."""
    jinja = hf_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config_file = hf_dir / "tokenizer_config.json"
    if not config_file.is_file():
        return None
    template = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: llama.cpp's default is "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def tokenizer_metadata(hf_dir: Path) -> dict[str, Any]:
    """llama.cpp's ``tokenizer.*`` keys for the folder's tokenizer, chat template included."""
    if not (hf_dir / "tokenizer.json").is_file():
        log.warning("'%s' has no tokenizer.json; the GGUF will have no vocabulary", hf_dir)
        return {}
    from tessera.text.tokenizer import Tokenizer

    metadata = dict(Tokenizer.from_hf_dir(hf_dir).gguf_metadata())
    template = chat_template(hf_dir)
    if template and "tokenizer.chat_template" not in metadata:
        metadata["tokenizer.chat_template"] = template
    return metadata


def _check_outtype(outtype: str) -> str:
    key = outtype.lower()
    if key not in OUTTYPES:
        raise TesseraError(f"unknown --outtype '{outtype}'; choose one of: {', '.join(OUTTYPES)}")
    return key


def _check_shapes(expected: Mapping[str, tuple[int, ...]], got: Mapping[str, Any], arch: str):
    missing = [n for n in expected if n not in got]
    if missing:
        raise ModelFileError(
            f"the checkpoint lacks tensor '{missing[0]}' (and {len(missing) - 1} more) that a "
            f"{arch} model with this config.json needs; the folder is incomplete"
        )
    for name, shape in expected.items():
        if tuple(np.shape(got[name])) != tuple(shape):
            raise ModelFileError(
                f"tensor '{name}' has shape {tuple(np.shape(got[name]))} but config.json "
                f"implies {tuple(shape)}; the checkpoint and its config.json do not match"
            )


def convert_hf_to_gguf(
    hf_dir: str | Path,
    outfile: str | Path,
    runtime: Any,
    outtype: str = "f16",
    name: str | None = None,
    progress: bool = False,
) -> Path:
    """Convert ``hf_dir`` to the GGUF file ``outfile``; return its path.

    Raises a :class:`TesseraError` (and writes nothing) for an unknown outtype, a folder
    that is not a model, an unknown ``model_type`` or missing tensors.
    """
    key = _check_outtype(outtype)
    qtype_name, file_type = OUTTYPES[key]
    runtime.quant_type_by_name(qtype_name)  # fail early if that quant plugin is missing
    resolved = resolve_model_path(hf_dir)  # a folder, or a packaged model's name
    if name is None and resolved != Path(hf_dir):
        name = Path(hf_dir).name  # "all-MiniLM-L6-v2", not the package's folder name
    hf_dir = resolved
    hf_config = read_hf_config(hf_dir)
    arch = runtime.hf_architecture_for(hf_config)
    config = arch.config_from_hf(hf_config)
    arch_metadata = arch.gguf_metadata(config)
    hf_tensors = read_safetensors_dir(hf_dir)
    tensors = dict(arch.tensors_from_hf(config, hf_tensors, for_gguf=True))
    _check_shapes(arch.tensor_shapes(config), tensors, arch_metadata["general.architecture"])
    shapes = {n: tuple(np.shape(v)) for n, v in tensors.items()}
    types = storage_types(shapes, qtype_name, runtime.quant_type_by_name)
    items: Iterable[tuple[str, Any]] = tensors.items()
    if progress:
        from tessera.progress_bar import progress as bar

        items = bar(items, f"converting to {key}", total=len(tensors))
    raw = [encode_tensor(n, v, types[n]) for n, v in items]
    # Key order as llama.cpp writes it: general, architecture, file type, vocab, quant version.
    metadata = {
        "general.architecture": arch_metadata["general.architecture"],
        "general.type": "model",
        "general.name": name or hf_dir.resolve().name,
        **arch_metadata,
        "general.file_type": file_type,
        **tokenizer_metadata(hf_dir),
        "general.quantization_version": QUANTIZATION_VERSION,
    }
    return write_gguf(outfile, metadata, raw)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="HF_DIR", help="Hugging Face model folder")
    parser.add_argument("outfile", metavar="OUT.gguf", help="GGUF file to write")
    parser.add_argument(
        "--outtype",
        default="f16",
        help=f"tensor type: {', '.join(OUTTYPES)} (default f16, as llama.cpp)",
    )
    parser.add_argument("--name", default=None, help="general.name (default: the folder name)")


def run(args: argparse.Namespace, runtime: Any) -> int:
    path = convert_hf_to_gguf(
        args.model, args.outfile, runtime, args.outtype, args.name, progress=True
    )
    size_mib = path.stat().st_size / 2**20
    print(f"wrote {path} ({args.outtype.lower()}, {size_mib:.1f} MiB)")
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command(
            "convert",
            "convert a Hugging Face safetensors folder to GGUF (like convert_hf_to_gguf.py)",
            add_arguments,
            run,
        )
    )
