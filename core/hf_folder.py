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
    return hf_config


def read_safetensors_dir(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's ``*.safetensors`` files as numpy (bf16 widened to f32,
    which is exact)."""
    import torch
    from safetensors import safe_open

    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"'{hf_dir}' has a config.json but no .safetensors weights")
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    tensors[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise ModelFileError(f"'{file}' is not a readable safetensors file ({exc})") from exc
    return tensors
