"""What the Models Manager shows of one model: its metadata read from the file's header
(GGUF key/values and tensor infos, or an HF folder's config.json and safetensors headers),
without loading the weights.

The answer names the facts a person picks a model by (architecture, parameter count,
training context, the quant types and how much of the weights each holds, the chat
template) and lists every other scalar metadata value as the file states it.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tessera.errors import TesseraError

#: Metadata values longer than this are cut in ``metadata`` (the chat template is given whole).
_MAX_VALUE_CHARS = 300
#: Arrays longer than this (vocabularies, merges) are summarised by their length.
_MAX_ARRAY_ITEMS = 16


def _shown(value: Any) -> Any:
    """A metadata value as the page lists it: long arrays and strings summarised."""
    if isinstance(value, list):
        if len(value) > _MAX_ARRAY_ITEMS:
            return f"[{len(value)} items]"
        return [_shown(v) for v in value]
    if isinstance(value, str) and len(value) > _MAX_VALUE_CHARS:
        return value[:_MAX_VALUE_CHARS] + f"\u2026 ({len(value)} characters)"
    return value


def _quant_types(tensors: Iterable[tuple[str, tuple[int, ...]]]) -> list[dict[str, Any]]:
    """(type name, shape) pairs -> one row per type: tensors and elements, most first."""
    n_tensors: collections.Counter[str] = collections.Counter()
    n_elements: collections.Counter[str] = collections.Counter()
    for type_name, shape in tensors:
        count = 1
        for dim in shape:
            count *= dim
        n_tensors[type_name] += 1
        n_elements[type_name] += count
    total = sum(n_elements.values()) or 1
    return [
        {
            "type": name,
            "tensors": n_tensors[name],
            "elements": elements,
            "share": round(elements / total, 4),
        }
        for name, elements in n_elements.most_common()
    ]


def _ggml_type_name(ggml_type: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def gguf_details(path: Path) -> dict[str, Any]:
    from tessera.files.gguf import read_gguf

    f = read_gguf(path)
    meta = f.metadata
    arch = f.architecture
    quant_types = _quant_types((_ggml_type_name(t.ggml_type), t.shape) for t in f.tensors.values())
    tokens = meta.get("tokenizer.ggml.tokens")
    return {
        "format": "gguf",
        "architecture": arch,
        "model_name": meta.get("general.name"),
        "parameters": sum(t.n_elements for t in f.tensors.values()),
        "n_ctx_train": int(meta.get(f"{arch}.context_length", 0) or 0),
        "n_embd": meta.get(f"{arch}.embedding_length"),
        "n_layer": meta.get(f"{arch}.block_count"),
        "n_head": meta.get(f"{arch}.attention.head_count"),
        "n_head_kv": meta.get(f"{arch}.attention.head_count_kv"),
        "n_vocab": len(tokens) if isinstance(tokens, list) else None,
        "quant_types": quant_types,
        "chat_template": meta.get("tokenizer.chat_template"),
        "metadata": {
            key: _shown(value)
            for key, value in sorted(meta.items())
            if key != "tokenizer.chat_template"
        },
    }


def _hf_chat_template(folder: Path) -> str | None:
    """The chat template of an HF folder: tokenizer_config.json's, else chat_template.jinja."""
    config_path = folder / "tokenizer_config.json"
    template = None
    if config_path.is_file():
        template = json.loads(config_path.read_text(encoding="utf-8")).get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next(
                (t.get("template") for t in template if t.get("name") == "default"), None
            )
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    return template if isinstance(template, str) else None


def _safetensors_shapes(folder: Path) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every tensor in the folder's safetensors files, from their headers."""
    from safetensors import safe_open

    out = []
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "np") as st:
            for name in st.keys():
                piece = st.get_slice(name)
                out.append((str(piece.get_dtype()), tuple(piece.get_shape())))
    return out


def hf_details(folder: Path) -> dict[str, Any]:
    from tessera.files.hf import read_hf_config

    config = read_hf_config(folder)
    shapes = _safetensors_shapes(folder)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return {
        "format": "hf",
        "architecture": str(config["model_type"]),
        "model_name": (config.get("architectures") or [None])[0],
        "parameters": sum(row["elements"] for row in _quant_types(shapes)),
        "n_ctx_train": int(text.get("max_position_embeddings") or 0),
        "n_embd": text.get("hidden_size"),
        "n_layer": text.get("num_hidden_layers"),
        "n_head": text.get("num_attention_heads"),
        "n_head_kv": text.get("num_key_value_heads"),
        "n_vocab": text.get("vocab_size"),
        "quant_types": _quant_types(shapes),
        "chat_template": _hf_chat_template(folder),
        "metadata": {
            key: _shown(value)
            for key, value in sorted(config.items())
            if not key.startswith("_") and not isinstance(value, dict)
        },
    }


def model_details(path: Path) -> dict[str, Any]:
    """The details of a GGUF file or HF folder; an unreadable one answers ``error``."""
    try:
        return hf_details(path) if path.is_dir() else gguf_details(path)
    except (TesseraError, OSError, ValueError, KeyError) as exc:
        return {"format": "hf" if path.is_dir() else "gguf", "error": str(exc)}
