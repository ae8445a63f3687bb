"""Loading a model: a GGUF file or a Hugging Face safetensors folder onto a backend.

The loader reads the architecture name, asks the runtime for the architecture plugin and
each tensor's quant type (clear errors if either is missing), hands every tensor to the
backend (which keeps or repacks quantized data) and builds the forward graph.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.contract.experts import MoEOptions, build_experts
from tessera.contract.ops import Op
from tessera.engine.memory import available_bytes, check_weights_fit, weight_bytes
from tessera.errors import ModelFileError, UnknownBackendError
from tessera.files.gc_pause import collector_paused
from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.hf import read_hf_config, read_safetensors_dir
from tessera.files.identity import deferred_identity

log = logging.getLogger("tessera.files.load")


@attrs.define
class Model:
    """A loaded model: architecture, config, weights on a backend, tokenizer, forward graph."""

    path: Path
    arch: Any
    config: Any
    backend: Any
    weights: dict[str, Any]
    graph: Any
    tokenizer: Any | None
    metadata: Mapping[str, Any]
    #: The identity (:attr:`identity`), or what computes it on first use (a callable):
    #: hashing the metadata of a large vocabulary is kept off the load path.
    _identity: str | Callable[[], str] = attrs.field(default="", alias="identity")
    #: A mixture-of-experts model's :class:`tessera.contract.experts.ModelExperts` (placement,
    #: cache counters); None for dense models.
    experts: Any = None
    #: Each tensor's stored quant type by name ("F32", "Q8_0" ...), as the file holds it.
    tensor_types: dict[str, str] = attrs.field(factory=dict)

    @property
    def identity(self) -> str:
        """sha256 hex of the metadata and the tensors' names, shapes, types and first bytes
        (see :func:`tessera.files.identity.model_identity`): saved context states are tied to it."""
        if callable(self._identity):
            self._identity = self._identity()
        return self._identity

    @property
    def n_vocab(self) -> int:
        return self.arch.n_vocab(self.config)

    @property
    def n_ctx_train(self) -> int:
        return int(getattr(self.config, "n_ctx_train", 4096))

    @property
    def chat_template(self) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.chat_template


def default_model_path() -> Path:
    """The small model shipped inside the package (used when no -m is given)."""
    from importlib.resources import files

    return Path(str(files("tessera") / "default_model" / "tessera-default.gguf"))


def unsupported_ops(backend: Any, arch: Any, config: Any) -> list[str]:
    """The ops (with parameters) of this model that ``backend``'s probe declines."""
    return [
        op + ("(" + ", ".join(f"{k}={v}" for k, v in params.items()) + ")" if params else "")
        for op, params in arch.required_ops(config)
        if not backend.supports(Op(op, params, backend.dtype))
    ]


def select_backend(
    runtime: Any, arch: Any, config: Any, name: str | None, device: str | None, dtype: str | None
) -> Any:
    """The named backend if it supports the model, else the first backend that does.

    With a name, a backend that declines one of the model's ops is an error. Without one,
    candidates are tried in the runtime's order of preference and each skip is logged.
    """
    if name is not None:
        backend = runtime.create_backend(name, device, dtype)
        missing = unsupported_ops(backend, arch, config)
        if missing:
            raise UnknownBackendError(
                f"backend '{name}' does not support {', '.join(missing)} needed by this model; "
                "choose another with --backend"
            )
        return backend
    reasons = []
    for candidate in runtime.backend_preference():
        try:
            backend = runtime.create_backend(candidate, device, dtype)
        except UnknownBackendError as exc:
            reasons.append(f"{candidate}: {exc}")
            continue
        missing = unsupported_ops(backend, arch, config)
        if not missing:
            for reason in reasons:
                log.info("backend skipped: %s", reason)
            return backend
        reasons.append(f"{candidate}: does not support {', '.join(missing)}")
    raise UnknownBackendError(
        "no installed backend can run this model (" + "; ".join(reasons) + ")"
    )


def load_model(
    path: str | os.PathLike[str],
    runtime: Any,
    backend: Any = None,
    progress: bool = False,
    *,
    device: str | None = None,
    dtype: str | None = None,
    moe: MoEOptions | None = None,
) -> Model:
    """Load a GGUF file or HF folder; raise a TesseraError on bad input.

    ``backend`` is a Backend instance, a backend name, or None for the best installed
    backend that supports every op of the model (see :func:`select_backend`). ``moe``
    places a mixture-of-experts model's experts (offload, expert cache; see
    :mod:`tessera.contract.experts`); other models ignore it.
    """
    with collector_paused():  # everything built here lives on: collections would find nothing
        return _load_model(path, runtime, backend, progress, device, dtype, moe)


def _load_model(
    path: str | os.PathLike[str],
    runtime: Any,
    backend: Any,
    progress: bool,
    device: str | None,
    dtype: str | None,
    moe: MoEOptions | None,
) -> Model:
    from tessera.files.model_names import resolve_model_path

    path = resolve_model_path(path)  # a path, or a packaged model's name
    if path.is_dir() and (path / "config.json").exists():
        arch, config, raw, metadata = _read_hf_dir(path, runtime)
    else:
        gguf = read_gguf(path)
        if not gguf.architecture:
            raise ModelFileError(
                f"'{path}' has no general.architecture key; it is a vocabulary-only or damaged "
                "GGUF file — pass a model file"
            )
        arch = runtime.architecture(gguf.architecture)
        shapes = {name: t.shape for name, t in gguf.tensors.items()}
        config = arch.config_from_gguf(gguf.metadata, shapes)
        arch = arch.variant(config)
        raw, metadata = gguf.tensors, gguf.metadata
    qtypes = {name: runtime.quant_type(t.ggml_type, name) for name, t in raw.items()}
    raw = {name: stored_tensor(t, qtypes[name]) for name, t in raw.items()}
    if backend is None or isinstance(backend, str):
        backend = select_backend(runtime, arch, config, backend, device, dtype)
    elif missing := unsupported_ops(backend, arch, config):
        raise UnknownBackendError(
            f"backend '{backend.name}' does not support {', '.join(missing)} needed by this model"
        )
    runtime.equip(backend)
    if backend.device == "cpu":
        need = weight_bytes(raw, qtypes, backend, runtime.weight_kernels())
        check_weights_fit(need, len(raw), backend.dtype, available_bytes())
    weights: dict[str, Any] = {}
    items = list(raw.items())
    if progress:
        from tessera.progress_bar import progress as bar

        items = bar(items, f"loading {path.name}", total=len(raw))
    layout = arch.expert_layout(config)
    expert_names = {n for t in layout.layers for n in t.names} if layout else set()
    for name, tensor in items:
        if name not in expert_names:  # experts are placed by build_experts below
            weights[name] = backend.load_weight(tensor, qtypes[name])
    experts = None
    if layout is not None:
        moe = moe or MoEOptions()
        cache = _expert_cache(runtime, layout, moe)
        experts = build_experts(layout, raw, qtypes, backend, moe, cache, str(path))
        graph = arch.build(config, weights, backend, experts=experts)
    else:
        graph = arch.build(config, weights, backend)
    has_vocab = (
        (path / "tokenizer.json").exists() if path.is_dir() else "tokenizer.ggml.model" in metadata
    )
    tokenizer = _tokenizer(path, metadata, runtime) if has_vocab else None
    identity = deferred_identity(metadata, raw)
    types = {name: qtype.name for name, qtype in qtypes.items()}
    return Model(
        path, arch, config, backend, weights, graph, tokenizer, metadata, identity, experts, types
    )


def _expert_cache(runtime: Any, layout: Any, moe: MoEOptions) -> Any | None:
    """The expert cache for the offloaded layers, or None (no budget, nothing offloaded,
    or no expert-cache plugin: offloaded experts are then converted on every use)."""
    offloaded = any(moe.offloaded(i) for i in range(len(layout.layers)))
    if not offloaded:
        if moe.cache_bytes:
            log.info("every expert is resident (no --cpu-moe / -ncmoe): the cache is unused")
        return None
    if not moe.cache_bytes:
        return None
    if moe.shared:
        cache = runtime.shared_expert_cache(moe.cache_bytes)
    else:
        infos = list(runtime.expert_caches().values())
        cache = infos[0].create(moe.cache_bytes) if infos else None
    if cache is None:
        log.warning("--moe-cache-mib given but no expert-cache plugin is loaded; not caching")
    return cache


def stored_tensor(raw: RawTensor, qtype: Any) -> RawTensor:
    """``raw`` with exactly the bytes ``qtype`` stores its shape in.

    The GGUF reader cannot size a tensor of a type the ``gguf`` package does not know (a
    plugin's type), so it hands over the bytes up to the next tensor, padding included.
    """
    n_cols = raw.shape[-1] if raw.shape else 1
    n_bytes = raw.n_elements // n_cols * qtype.row_bytes(n_cols)
    if raw.data.size < n_bytes:
        raise ModelFileError(
            f"tensor '{raw.name}' has {raw.data.size} bytes but {qtype.name} needs {n_bytes} "
            f"for shape {raw.shape}; the file is truncated or damaged — convert it again"
        )
    if raw.data.size == n_bytes:
        return raw
    return RawTensor(raw.name, raw.ggml_type, raw.shape, raw.data[:n_bytes])


def _tokenizer(path: Path, metadata: Mapping[str, Any], runtime: Any) -> Any | None:
    from tessera.text.tokenizer import Tokenizer

    if path.is_dir():
        return Tokenizer.from_hf_dir(path)
    return Tokenizer.from_gguf_metadata(metadata, runtime)


_SAFETENSORS_TYPES = {"F32": 0, "F16": 1}


def _read_hf_dir(path: Path, runtime: Any) -> tuple[Any, Any, dict[str, RawTensor], dict]:
    """Config and tensors of an HF folder, renamed to GGUF names by the architecture."""
    hf_config = read_hf_config(path)
    arch = runtime.hf_architecture_for(hf_config)
    config = arch.config_from_hf(hf_config)
    hf_tensors = read_safetensors_dir(path)
    raw = {
        name: _raw_from_array(name, value)
        for name, value in arch.tensors_from_hf(config, hf_tensors, for_gguf=False)
    }
    metadata = arch.gguf_metadata(config)
    return arch.variant(config), config, raw, metadata


def _raw_from_array(name: str, value: np.ndarray) -> RawTensor:
    value = np.ascontiguousarray(value)
    if value.dtype != np.float16:
        value = value.astype(np.float32, copy=False)
    ggml_type = _SAFETENSORS_TYPES["F16" if value.dtype == np.float16 else "F32"]
    return RawTensor(name, ggml_type, tuple(value.shape), value.view(np.uint8).reshape(-1))
