"""Reading Hugging Face model folders: config.json and *.safetensors weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from tessera.errors import ModelFileError


def read_hf_config(hf_dir: Path) -> dict[str, Any]:
    """The folder's config.json; ModelFileError if it is missing, not JSON or not a model's."""
    config_file = hf_dir / "config.json"
    if not config_file.is_file():
        what = "does not exist" if not hf_dir.exists() else "has no config.json"
        raise ModelFileError(
            f"'{hf_dir}' {what}; pass the folder of a Hugging Face model (config.json and "
            "*.safetensors)"
        )
    try:
        hf_config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"'{config_file}' is not valid JSON ({exc})") from exc
    if "model_type" not in hf_config:
        raise ModelFileError(f"'{config_file}' has no model_type; it is not a model config")
    pooling = sentence_transformers_pooling(hf_dir)
    if pooling is not None:
        # for config_from_hf, which sees config.json only (as llama.cpp's converter reads it)
        hf_config["_st_pooling"] = pooling
    # for config_from_hf too: GLM-4.5 checkpoints keep their MTP blocks after the main ones,
    # transformers' save_pretrained drops them (num_nextn_predict_layers stays)
    hf_config["_checkpoint_layers"] = checkpoint_layers(hf_dir)
    return hf_config


def checkpoint_layers(hf_dir: Path) -> int:
    """How many blocks (``model.layers.N.``) the folder's weights hold, read from the
    safetensors headers (0 when there are none)."""
    from safetensors import safe_open

    found = -1
    for file in sorted(hf_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="np") as f:
                names = list(f.keys())
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise ModelFileError(f"'{file}' is not a readable safetensors file ({exc})") from exc
        for name in names:
            if name.startswith("model.layers."):
                found = max(found, int(name.split(".")[2]))
    return found + 1


#: sentence-transformers Pooling config flags -> llama.cpp pooling type names.
_ST_POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}


def sentence_transformers_pooling(hf_dir: Path) -> str | None:
    """The pooling of a sentence-transformers folder (``modules.json`` -> its Pooling
    module's ``config.json``): ``mean``, ``cls`` or ``last``; None if it has none."""
    modules_file = hf_dir / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text())
        module = next(
            (m for m in modules if m.get("type") == "sentence_transformers.models.Pooling"), None
        )
        if module is None:
            return None
        pooling = json.loads((hf_dir / module["path"] / "config.json").read_text())
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
        raise ModelFileError(
            f"'{modules_file}' or its Pooling config is unreadable ({exc}); fix or remove it"
        ) from exc
    for flag, name in _ST_POOLING_MODES.items():
        if pooling.get(flag):
            return name
    raise ModelFileError(
        f"the sentence-transformers pooling in '{hf_dir / module['path']}' is none of mean, "
        "cls or last tokens, which tessera (like llama.cpp) does not support"
    )


def read_safetensors_dir(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's ``*.safetensors`` files as numpy (bf16 widened to f32,
    which is exact)."""
    import torch
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"'{hf_dir}' has a config.json but no .safetensors weights")
    tensors: dict[str, np.ndarray] = {}
    dense = sentence_transformers_dense(hf_dir)
    for file in files + list(dense):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    # a Dense module's linear.weight is named as llama.cpp's converter does
                    name = dense[file] if file in dense and name == "linear.weight" else name
                    tensors[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise ModelFileError(f"'{file}' is not a readable safetensors file ({exc})") from exc
    return tensors


def sentence_transformers_dense(hf_dir: Path) -> dict[Path, str]:
    """The weight files of a sentence-transformers folder's Dense modules (projections after
    pooling, as EmbeddingGemma has), each with the name its ``linear.weight`` takes:
    ``dense_{idx}_out.weight`` (llama.cpp's HF-side name)."""
    modules_file = hf_dir / "modules.json"
    if not modules_file.is_file():
        return {}
    try:
        modules = json.loads(modules_file.read_text())
        dense = [m for m in modules if m.get("type") == "sentence_transformers.models.Dense"]
        out = {}
        for m in dense:
            config = json.loads((hf_dir / m["path"] / "config.json").read_text())
            if config.get("bias") or "Identity" not in config.get("activation_function", "Id"):
                raise ModelFileError(
                    f"the Dense module '{m['path']}' has a bias or an activation; tessera reads "
                    "only bias-free linear projections (as EmbeddingGemma's)"
                )
            out[hf_dir / m["path"] / "model.safetensors"] = f"dense_{int(m['idx'])}_out.weight"
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ModelFileError(
            f"'{modules_file}' or a Dense module's config is unreadable ({exc}); fix or remove it"
        ) from exc
    return out
