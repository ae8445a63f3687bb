"""Saving and restoring one sequence of a context: its KV cells, token history and RNG.

A state file is ``magic | u32 format version | u32 header length | JSON header | payload |
sha256`` where the checksum covers every byte before it. The payload holds the cells'
positions (int32), the token history (int32), then per cache layer the K and V rows of
those cells, layer by layer: float32 for a cache in the compute dtype (format 1), and in
the cache's own type for ``-ctk`` / ``-ctv`` f16 (float16) or q8_0 (its blocks), named by
the header's ``type_k`` / ``type_v`` (format 2; :func:`tessera.engine.kv_types.encode`).
A model with recurrent layers adds the sequence's states after them, float32 in the compute
dtype's format, with their shapes and the position they end at under ``recurrent`` (format 3).

The tensors move through the backend's batched transfers (``get_n`` / ``set_n``) when its
probe says yes and ``TESSERA_BATCHED_COPY_DISABLE`` is unset, else through the per-tensor
defaults of :class:`tessera.contract.backend.Backend`. Loading validates the whole file against the
context before it touches the cache, so a refused file leaves the context as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import struct
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.contract.backend import Backend
from tessera.contract.ops import Op
from tessera.engine.kv_types import decode, encode, encoded_bytes
from tessera.errors import ContextOverflowError, TesseraError
from tessera.switches import BATCHED_COPY_DISABLE, Choice, choose

MAGIC = b"TSRSTATE"
#: The newest format this tessera reads; files of caches in the compute dtype are written
#: as format 1 (what earlier versions read), files with other cache types as format 2.
FORMAT_VERSION = 3
#: The variable that moves tensors one at a time (declared in :mod:`tessera.switches`).
BATCHED_COPY_DISABLE_ENV = BATCHED_COPY_DISABLE.name
_PREFIX = struct.Struct("<8sII")  # magic, format version, header length
_DIGEST = 32


class StateFileError(TesseraError):
    """A context state file cannot be loaded into this context."""


def batched_transfers(backend: Backend, op: str) -> Choice:
    """``(use the backend's batched op, why)``: its probe says yes and no switch is set."""

    def probe() -> tuple[bool, str]:
        described = Op(op, dtype=backend.dtype)
        if backend.supports(described) and backend.worth(described):
            return True, f"backend {backend.name} supports {op}"
        return False, f"backend {backend.name} does not support {op}"

    return choose(BATCHED_COPY_DISABLE, probe)


def get_n(backend: Backend, tensors: Sequence[Any], rows_list: Sequence[Any]) -> list[np.ndarray]:
    """The backend's ``get_n`` or, when :func:`batched_transfers` says no, the per-tensor one."""
    if batched_transfers(backend, "get_n")[0]:
        return backend.get_n(tensors, rows_list)
    return Backend.get_n(backend, tensors, rows_list)


def set_n(backend: Backend, dsts: Sequence[Any], rows_list: Sequence[Any], srcs: Sequence) -> None:
    """The backend's ``set_n`` or, when :func:`batched_transfers` says no, the per-tensor one."""
    if batched_transfers(backend, "set_n")[0]:
        backend.set_n(dsts, rows_list, srcs)
    else:
        Backend.set_n(backend, dsts, rows_list, srcs)


@attrs.frozen
class SavedState:
    """What :func:`load_state` read: the token history and the sampler RNG state."""

    tokens: list[int]
    rng_state: dict | None


def _layers(ctx: Any) -> list[tuple[Any, Any]]:
    return [(k, v) for k, v in zip(ctx.kv.k, ctx.kv.v, strict=True) if k is not None]


def _states(ctx: Any) -> list[Any]:
    """The recurrent state tensors (one row per sequence), none for a KV-only model."""
    return [] if getattr(ctx, "recurrent", None) is None else ctx.recurrent.tensors()


def _types(ctx: Any) -> tuple[str, str]:
    """The K and V cache types of ``ctx`` by name (the compute dtype's for its default)."""
    dtype = ctx.model.backend.dtype
    return ctx.kv.type_k or dtype, ctx.kv.type_v or dtype


def _seq_cells(ctx: Any, seq_id: int) -> np.ndarray:
    """The cells ``seq_id`` sees, in position order."""
    cells = np.flatnonzero((ctx.kv.seqs & np.uint64(1 << seq_id)) != 0)
    return cells[np.argsort(ctx.kv.pos[cells], kind="stable")]


def save_state(
    ctx: Any, path: str | os.PathLike[str], seq_id: int, tokens: Sequence[int], rng_state: Any
) -> Path:
    """Write sequence ``seq_id`` of ``ctx`` to ``path`` (a temp file renamed over it)."""
    path = Path(path)
    backend = ctx.model.backend
    cells = _seq_cells(ctx, seq_id)
    layers = _layers(ctx)
    tensors, states = [t for kv in layers for t in kv], _states(ctx)
    rows = [cells] * len(tensors) + [np.array([seq_id])] * len(states)
    arrays = get_n(backend, tensors + states, rows)
    types = _types(ctx)
    header = {
        "model": ctx.model.identity,
        "n_layer": len(layers),
        "dtype": backend.dtype,
        "n_cells": len(cells),
        "n_tokens": len(tokens),
        "shapes": [list(t.shape[1:]) for t in tensors],
        "rng_state": rng_state,
    }
    version = 1 if types == (backend.dtype,) * 2 else 2
    if version == 2:
        header["type_k"], header["type_v"] = types
    if states:
        version = 3
        end = int(ctx.recurrent.pos[seq_id])
        header["recurrent"] = {"pos": end, "shapes": [list(t.shape[1:]) for t in states]}
    head = json.dumps(header, sort_keys=True).encode()
    h = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        with open(tmp, "wb") as f:
            chunks = [
                _PREFIX.pack(MAGIC, version, len(head)),
                head,
                ctx.kv.pos[cells].astype("<i4"),
                np.asarray(tokens, dtype="<i4"),
                *(
                    encode(a, types[i % 2], backend.dtype)
                    for i, a in enumerate(arrays[: len(tensors)])
                ),
                *(encode(a, backend.dtype, backend.dtype) for a in arrays[len(tensors) :]),
            ]
            for chunk in chunks:
                data = memoryview(chunk).cast("B")
                h.update(data)
                f.write(data)
            f.write(h.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _read(ctx: Any, path: Path) -> tuple[dict, np.ndarray, np.ndarray, list[np.ndarray]]:
    """Read and check the whole file against ``ctx``; raise StateFileError on any mismatch."""
    try:
        data = bytearray(path.read_bytes())  # writable: torch can wrap it without a copy
    except OSError as exc:
        raise StateFileError(f"cannot read state file '{path}' ({exc.strerror})") from exc
    if len(data) < _PREFIX.size + _DIGEST or bytes(data[:8]) != MAGIC:
        raise StateFileError(f"'{path}' is not a tessera context state file")
    _, version, n_head = _PREFIX.unpack_from(data)
    body = memoryview(data)[: len(data) - _DIGEST]
    intact = hashlib.sha256(body).digest() == bytes(data[-_DIGEST:])
    # The checksum first: a flipped bit in the version field is damage, not a newer format
    # (a newer file this tessera cannot check is named as both).
    if not intact and version <= FORMAT_VERSION:
        raise StateFileError(f"'{path}' is corrupt or truncated (checksum mismatch); delete it")
    if version > FORMAT_VERSION:
        what = "" if intact else "is corrupt (checksum mismatch) or "
        raise StateFileError(
            f"'{path}' {what}has state format version {version}, newer than this tessera's "
            f"{FORMAT_VERSION}; upgrade tessera or delete the file"
        )
    try:
        header = json.loads(bytes(body[_PREFIX.size : _PREFIX.size + n_head]))
        n_cells, n_tokens = int(header["n_cells"]), int(header["n_tokens"])
        shapes = [tuple(s) for s in header["shapes"]]
        state_shapes = [tuple(s) for s in header.get("recurrent", {}).get("shapes", [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateFileError(f"'{path}' has a damaged header; delete it") from exc
    model = ctx.model
    if header.get("model") != model.identity:
        raise StateFileError(f"'{path}' was saved with a different model than '{model.path}'")
    layers = _layers(ctx)
    want = [tuple(t.shape[1:]) for kv in layers for t in kv]
    if header.get("n_layer") != len(layers) or shapes != want:
        raise StateFileError(f"'{path}' has a KV cache layout that does not match this model")
    if state_shapes != [tuple(t.shape[1:]) for t in _states(ctx)]:
        raise StateFileError(f"'{path}' has recurrent states that do not match this model")
    dtype = model.backend.dtype
    if header.get("dtype") != dtype:
        raise StateFileError(
            f"'{path}' was saved with KV cache dtype {header.get('dtype')}, this context uses "
            f"{dtype}; load it with --dtype {header.get('dtype')}"
        )
    saved = header.get("type_k", dtype), header.get("type_v", dtype)
    if saved != _types(ctx):
        raise StateFileError(
            f"'{path}' holds a KV cache of K {saved[0]}, V {saved[1]}, this context stores "
            f"K {_types(ctx)[0]}, V {_types(ctx)[1]}; load it with -ctk {saved[0]} -ctv {saved[1]}"
        )
    sizes = (
        [4 * n_cells, 4 * n_tokens]
        + [
            encoded_bytes(n_cells * int(np.prod(s)), saved[i % 2], dtype)
            for i, s in enumerate(shapes)
        ]
        + [encoded_bytes(int(np.prod(s)), dtype, dtype) for s in state_shapes]
    )
    offset = _PREFIX.size + n_head
    if offset + sum(sizes) != len(body):
        raise StateFileError(f"'{path}' has a payload of the wrong size; delete it")
    parts = []
    for size in sizes:
        parts.append(np.frombuffer(data, dtype=np.uint8, count=size, offset=offset))
        offset += size
    positions, tokens = parts[0].view("<i4"), parts[1].view("<i4")
    arrays = [
        decode(a, saved[i % 2], dtype, (n_cells, *s))
        for i, (a, s) in enumerate(zip(parts[2 : 2 + len(shapes)], shapes, strict=True))
    ] + [
        decode(a, dtype, dtype, (1, *s))
        for a, s in zip(parts[2 + len(shapes) :], state_shapes, strict=True)
    ]
    if n_cells and (positions.min() < 0 or positions.max() >= ctx.n_ctx):
        raise StateFileError(f"'{path}' holds positions beyond this context's {ctx.n_ctx} tokens")
    if n_tokens and (tokens.min() < 0 or tokens.max() >= model.n_vocab):
        raise StateFileError(f"'{path}' holds token ids outside this model's vocabulary")
    return header, positions, tokens, arrays


def load_state(
    ctx: Any, path: str | os.PathLike[str], seq_id: int, sampler: Any = None
) -> SavedState:
    """Replace sequence ``seq_id`` of ``ctx`` with the one saved in ``path``, and restore
    ``sampler``'s RNG from it.

    Everything is checked before the cache changes: on any error the context is unchanged.
    """
    path = Path(path)
    if not 0 <= seq_id < ctx.params.n_seq_max:
        raise TesseraError(f"sequence id {seq_id} is not in [0, {ctx.params.n_seq_max})")
    header, positions, tokens, arrays = _read(ctx, path)
    rng_state = header.get("rng_state")
    if sampler is not None and rng_state is not None:
        _check_rng_state(path, sampler, rng_state)
    kv = ctx.kv
    n_cells = len(positions)
    before = kv.snapshot()
    kv.seq_rm(seq_id)  # its old cells are free for the restored ones
    try:
        cells = kv.find_slot(n_cells, np.full(n_cells, seq_id))
    except ContextOverflowError as exc:
        kv.restore(before)
        raise StateFileError(
            f"'{path}' holds {n_cells} cells but the context has fewer free; raise -c"
        ) from exc
    tensors, states = [t for pair in _layers(ctx) for t in pair], _states(ctx)
    rows = [cells] * len(tensors) + [np.array([seq_id])] * len(states)
    try:
        set_n(ctx.model.backend, tensors + states, rows, arrays)
    except BaseException:
        kv.restore(before)
        raise
    kv.commit(cells, positions, np.full(n_cells, seq_id))
    if states:
        ctx.recurrent.pos[seq_id] = int(header["recurrent"]["pos"])
    if sampler is not None and rng_state is not None:
        sampler.rng.bit_generator.state = rng_state
    return SavedState([int(t) for t in tokens], rng_state)


def _check_rng_state(path: Path, sampler: Any, rng_state: Any) -> None:
    """Refuse an RNG state the sampler's generator cannot take, before the cache changes."""
    trial = copy.deepcopy(sampler.rng.bit_generator)
    try:
        trial.state = rng_state
    except (TypeError, ValueError, KeyError) as exc:
        raise StateFileError(
            f"'{path}' holds a sampler RNG state this sampler cannot restore ({exc}); "
            "save the state again with this version of tessera"
        ) from exc
