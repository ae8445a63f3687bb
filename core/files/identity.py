"""A model's identity: a sha256 digest of its metadata and of each tensor's name, shape,
type and first values, to which saved context states and the server's fingerprints are tied.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tessera.files.gguf import RawTensor

__all__ = ["deferred_identity", "model_identity"]


def model_identity(metadata: Mapping[str, Any], raw: Mapping[str, RawTensor]) -> str:
    """A sha256 hex digest naming one model: its metadata, and per tensor its name, shape,
    GGML type and first 64 stored values (so two random-weight models of one shape differ too)."""
    return _identity_digest(metadata, _tensor_heads(raw))


def deferred_identity(
    metadata: Mapping[str, Any], raw: Mapping[str, RawTensor]
) -> Callable[[], str]:
    """:func:`model_identity` of ``metadata`` and ``raw``, computed when called: the tensors'
    first bytes are copied now (the file may be closed by then), the hashing waits."""
    heads = _tensor_heads(raw)
    return lambda: _identity_digest(metadata, heads)


def _tensor_heads(raw: Mapping[str, RawTensor]) -> list[tuple[tuple[Any, ...], bytes]]:
    """Per tensor, by name: ``(name, shape, GGML type)`` and its first 64 stored values."""
    return [
        (
            (name, tuple(raw[name].shape), raw[name].ggml_type),
            np.asarray(raw[name].data).ravel()[:64].tobytes(),
        )
        for name in sorted(raw)
    ]


def _identity_digest(
    metadata: Mapping[str, Any], heads: list[tuple[tuple[Any, ...], bytes]]
) -> str:
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, np.ndarray):
            h.update(f"{value.dtype}{value.shape}".encode() + value.tobytes())
        elif isinstance(value, list | tuple):
            h.update(b"[")
            for v in value:
                feed(v)
            h.update(b"]")
        else:
            h.update(repr(value).encode() + b"\x00")

    for key in sorted(metadata):
        feed(key)
        feed(metadata[key])
    for key, head in heads:
        feed(key)
        h.update(head)
    return h.hexdigest()
