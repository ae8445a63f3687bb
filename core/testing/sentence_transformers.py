"""Turning a random-weight HF model folder into a sentence-transformers one (the embedding
parity tests' oracle reads it)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_sentence_transformers_modules(
    path: str | os.PathLike[str], dense: Sequence[np.ndarray] = (), normalize: bool = False
) -> None:
    """Make an HF model folder a sentence-transformers one: ``modules.json`` with the
    Transformer, a mean Pooling, one bias-free Dense layer (identity activation) per
    ``(out, in)`` weight of ``dense``, in order, and a Normalize module if asked; with each
    module's files (``1_Pooling/config.json``, ``{i}_Dense/{model.safetensors, config.json}``).
    """
    from safetensors.numpy import save_file

    path = Path(path)
    kind = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": kind + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind + "Pooling"},
    ]
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    for idx, w in enumerate(dense, start=2):
        folder = path / f"{idx}_Dense"
        folder.mkdir()
        w = np.ascontiguousarray(w, dtype=np.float32)
        save_file({"linear.weight": w}, str(folder / "model.safetensors"))
        config = {
            "in_features": w.shape[1],
            "out_features": w.shape[0],
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
        }
        (folder / "config.json").write_text(json.dumps(config))
        modules.append({"idx": idx, "name": str(idx), "path": folder.name, "type": kind + "Dense"})
    if normalize:
        idx = len(modules)
        modules.append(
            {"idx": idx, "name": str(idx), "path": f"{idx}_Normalize", "type": kind + "Normalize"}
        )
    (path / "modules.json").write_text(json.dumps(modules))
