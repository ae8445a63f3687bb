"""The constructor options of :class:`tessera.LLM` beyond its own keywords: the
:class:`~tessera.engine.context.ContextParams` fields and llama-cpp-python's ``Llama``
names where tessera has the meaning (``model_path``, ``seed``, ``verbose``,
``n_gpu_layers``, ``flash_attn`` as a bool). Anything else is a TypeError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from tessera.engine.context import ContextParams
from tessera.errors import TesseraError

CONTEXT_FIELDS = tuple(f.name for f in attrs.fields(ContextParams))
#: LLM's own keywords (in its signature), named in the unknown-option error.
OWN_KEYWORDS = ("backend", "device", "dtype", "n_threads", "pooling", "chat_template")
#: llama-cpp-python's names LLM takes besides the context fields.
LLAMA_CPP_KEYWORDS = ("model_path", "seed", "verbose", "n_gpu_layers")
#: The seeds llama-cpp-python and llama.cpp read as "random" (LLAMA_DEFAULT_SEED and -1).
RANDOM_SEEDS = (None, -1, 0xFFFFFFFF)


@attrs.frozen
class LoadOptions:
    """What the constructor's options ask for, checked."""

    model: str | os.PathLike[str] | None
    #: A progress bar while the model loads (llama-cpp-python's ``verbose``).
    progress: bool
    #: Draws the seed of each call that names none (None: such calls are random).
    seeds: np.random.Generator | None = attrs.field(eq=False)
    context: Mapping[str, Any]


def load_options(
    model: str | os.PathLike[str] | None, device: str | None, options: Mapping[str, Any]
) -> LoadOptions:
    """The checked :class:`LoadOptions` of ``model`` and the remaining keywords."""
    unknown = sorted(set(options) - set(CONTEXT_FIELDS) - set(LLAMA_CPP_KEYWORDS))
    if unknown:
        raise TypeError(
            f"LLM got unknown option(s) {', '.join(unknown)}; it takes "
            f"{', '.join((*OWN_KEYWORDS, *LLAMA_CPP_KEYWORDS, *CONTEXT_FIELDS))}"
        )
    context = {k: v for k, v in options.items() if k in CONTEXT_FIELDS}
    if isinstance(context.get("flash_attn"), bool):  # llama-cpp-python's on/off switch
        context["flash_attn"] = "on" if context["flash_attn"] else "off"
    path = options.get("model_path")
    if path is not None and model is not None:
        raise TesseraError(
            "LLM got both model and model_path; give one of them (they mean the same)"
        )
    if "n_gpu_layers" in options:
        _check_gpu_layers(options["n_gpu_layers"], device)
    return LoadOptions(
        model=model if path is None else path,
        progress=bool(options.get("verbose", True)),
        seeds=_seeds(options.get("seed")),
        context=context,
    )


def _seeds(seed: Any) -> np.random.Generator | None:
    if seed in RANDOM_SEEDS and not isinstance(seed, bool):
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TesseraError(
            f"seed must be a non-negative integer (or -1 for random calls), got {seed!r}"
        )
    return np.random.default_rng(seed)


def _check_gpu_layers(n_gpu_layers: Any, device: str | None) -> None:
    """0 (no layer offloaded) and -1 (all of them) are the two placements tessera has: it
    runs every layer on the one device ``device`` names."""
    if n_gpu_layers not in (0, -1) or isinstance(n_gpu_layers, bool):
        raise TesseraError(
            f"n_gpu_layers={n_gpu_layers!r} would split the layers between devices, which "
            "tessera does not do; give 0 or -1 and choose the device with device='cpu' or "
            "device='cuda'"
        )
    if n_gpu_layers == 0 and device is not None and not device.startswith("cpu"):
        raise TesseraError(
            f"n_gpu_layers=0 keeps every layer on the CPU but device={device!r} asks for "
            "another device; give n_gpu_layers=-1 or device='cpu'"
        )
