"""Named model shapes (real layer counts and widths) as random-weight models, for benchmarks.

``tessera bench --shape gemma4-e2b`` measures a model of Gemma 4 E2B's shape without its
weights, which cannot be downloaded here. A shape is an architecture plus the fields of
its config that make the real model's size; only the vocabulary is shrunk (to
``n_vocab``, default :data:`DEFAULT_SHAPE_VOCAB`), since the vocabulary sets memory more
than speed (one output row per generated token). :func:`random_model` builds the model
in memory, tensor by tensor, on a backend: no file is written, and the peak memory is
the model itself in the backend's dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tessera.errors import TesseraError

#: Vocabulary of shape models unless told otherwise (real ones have 150k-262k tokens).
DEFAULT_SHAPE_VOCAB = 8192


def _gemma4(n_layer: int, n_embd: int, n_ff: int, n_head_kv: int, n_shared: int, every: int,
            wide: bool) -> dict[str, Any]:  # fmt: skip
    return {
        "n_embd": n_embd,
        "n_layer": n_layer,
        "n_head": 8,
        "n_head_kv": n_head_kv,
        "n_ff": n_ff,
        "double_wide_ffn": wide,
        "head_dim": 512,
        "head_dim_swa": 256,
        "n_swa": 512,
        "n_kv_shared": n_shared,
        "n_embd_per_layer": 256,
        # every ``every``-th layer is global, the others slide
        "swa_layers": tuple((i + 1) % every != 0 for i in range(n_layer)),
        "partial_rotary_factor": 0.25,
        "final_logit_softcapping": 30.0,
    }


#: name -> (architecture, config fields). Sizes from the models' published configs.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "gemma4-e2b": ("gemma4", _gemma4(35, 1536, 6144, 1, 20, 5, wide=True)),
    "gemma4-e4b": ("gemma4", _gemma4(42, 2560, 10240, 2, 18, 6, wide=False)),
    "qwen2-0.5b": (
        "qwen2",
        {"n_embd": 896, "n_layer": 24, "n_head": 14, "n_head_kv": 2, "n_ff": 4864,
         "head_dim": 64, "rope_freq_base": 1e6, "tied_embeddings": True},
    ),
    "qwen3-0.6b": (
        "qwen3",
        {"n_embd": 1024, "n_layer": 28, "n_head": 16, "n_head_kv": 8, "n_ff": 3072,
         "head_dim": 128, "rope_freq_base": 1e6, "tied_embeddings": True},
    ),
    "llama-1b": (
        "llama",
        {"n_embd": 2048, "n_layer": 16, "n_head": 32, "n_head_kv": 8, "n_ff": 8192,
         "head_dim": 64, "rope_freq_base": 5e5, "tied_embeddings": True},
    ),
}  # fmt: skip


def shape_config(runtime: Any, name: str, n_vocab: int = DEFAULT_SHAPE_VOCAB) -> tuple[Any, Any]:
    """``(architecture, config)`` of shape ``name``; a clear error for an unknown name."""
    if name not in SHAPES:
        raise TesseraError(f"unknown shape '{name}'; choose one of: {', '.join(SHAPES)}")
    arch_name, fields = SHAPES[name]
    arch = runtime.architecture(arch_name)
    return arch, arch.example_config(arch=arch_name, n_vocab=n_vocab, **fields)


def _values(rng: np.random.Generator, pool: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """N(0, 0.02)-distributed values from a shared pool at a random offset: drawing billions
    of fresh normals would take minutes, and a benchmark needs only realistic magnitudes."""
    n = int(np.prod(shape))
    start = int(rng.integers(0, len(pool)))
    return np.resize(np.roll(pool, -start), n).reshape(shape)


def random_model(
    runtime: Any,
    name: str,
    backend: Any = None,
    n_vocab: int = DEFAULT_SHAPE_VOCAB,
    seed: int = 0,
    *,
    device: str | None = None,
    dtype: str | None = None,
    progress: bool = False,
) -> Any:
    """A :class:`tessera.files.load.Model` of shape ``name`` with random weights (no tokenizer:
    benchmarks feed token ids). ``backend`` is a Backend, a name, or None for the best one
    that runs the model, as :func:`tessera.files.load.load_model` chooses. ``progress``
    draws a bar over the tensors on a terminal (a full-size shape takes a while)."""
    from tessera.files.gguf import RawTensor
    from tessera.files.load import Model, select_backend, unsupported_ops

    arch, config = shape_config(runtime, name, n_vocab)
    if backend is None or isinstance(backend, str):
        backend = select_backend(runtime, arch, config, backend, device, dtype)
    elif missing := unsupported_ops(backend, arch, config):
        raise TesseraError(f"backend '{backend.name}' does not support {', '.join(missing)}")
    runtime.equip(backend)
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 22, dtype=np.float32) * np.float32(0.02)).astype(np.float32)
    fixed: Mapping[str, np.ndarray] = arch.example_tensors(config)
    f32 = runtime.quant_type_by_name("F32")
    weights: dict[str, Any] = {}
    all_shapes = arch.tensor_shapes(config)
    shapes: Iterable[tuple[str, tuple[int, ...]]] = all_shapes.items()
    if progress:
        from tessera.progress_bar import progress as bar

        shapes = bar(shapes, f"building random {name}", total=len(all_shapes))
    for tensor, shape in shapes:
        values = fixed.get(tensor)
        if values is None:
            values = _values(rng, pool, shape)
            if len(shape) == 1 and tensor.endswith("norm.weight"):
                values = values + np.float32(1.0)
        values = np.ascontiguousarray(values, dtype=np.float32)
        raw = RawTensor(tensor, f32.ggml_type, tuple(shape), values.view(np.uint8).reshape(-1))
        weights[tensor] = backend.load_weight(raw, f32)
    graph = arch.build(config, weights, backend)
    metadata = {**arch.gguf_metadata(config), "general.name": f"random {name}"}
    types = dict.fromkeys(all_shapes, "F32")
    return Model(
        Path(name), arch, config, backend, weights, graph, None, metadata, name, tensor_types=types
    )
