"""Tensor parallelism: each rank loads only its shard of a model and joins a group.

An architecture that can be split returns a plan from ``Architecture.tensor_parallel``
(see :class:`tessera.contract.tp.TensorParallelPlan`); this module executes it generically: it reads
the model file (memory-mapped, so a rank only touches the bytes of its shard), cuts every
tensor as the plan says (:func:`slice_tensor`, quantized blocks included), loads the
slices on the backend, then forms the group (:func:`form_group`: rendezvous, capability
exchange, communicator choice) and builds the plan's graph over that communicator.

Switch: ``TESSERA_TP_REPLICATE_LM_HEAD=1`` (:data:`REPLICATE_LM_HEAD`) keeps the whole LM
head on every rank (no all-gather of logits) instead of splitting it by vocabulary rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from tessera.contract.comm import (
    DEFAULT_TIMEOUT_S,
    Communicator,
    CommunicatorError,
    CommunicatorProbe,
    GroupSpec,
)
from tessera.contract.tp import Split
from tessera.errors import ModelFileError, TesseraError
from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.identity import deferred_identity
from tessera.files.load import Model, select_backend, stored_tensor
from tessera.plugins.tensor_parallel.choice import choose_communicator
from tessera.plugins.tensor_parallel.ports import free_port, parse_master
from tessera.plugins.tensor_parallel.rendezvous import rendezvous
from tessera.switches import OFF, Switch, flag

log = logging.getLogger("tessera.tp")

REPLICATE_LM_HEAD = Switch(
    "TESSERA_TP_REPLICATE_LM_HEAD",
    "tensor parallel keeps the whole LM head on every rank instead of splitting its rows",
    OFF,
)


def slice_tensor(raw: RawTensor, qtype: Any, split: Split) -> RawTensor:
    """The part ``split`` of a stored tensor, still in its storage type (no dequantizing).

    Columns are cut at whole quant blocks; a cut inside a block is an error naming the
    tensor, since the block's scale covers values on both sides.
    """
    shape = raw.shape if len(raw.shape) == 2 else (1, *raw.shape)
    n_rows, n_cols = shape
    row_bytes = qtype.row_bytes(n_cols)
    data = raw.data.reshape(n_rows, row_bytes)
    if split.axis == 0 and len(raw.shape) == 2:
        part = data[split.lo : min(split.hi, n_rows)]
        if split.hi > n_rows:  # zero bytes decode to zeros in every GGML type
            pad = np.zeros((split.hi - max(split.lo, n_rows), row_bytes), dtype=np.uint8)
            part = np.concatenate([part, pad])
        new_shape: tuple[int, ...] = (split.hi - split.lo, n_cols)
    else:
        bs = qtype.block_size
        if split.lo % bs or split.hi % bs:
            raise TesseraError(
                f"tensor '{raw.name}' is stored as {qtype.name} in blocks of {bs} values and "
                f"cannot be split at column {split.lo if split.lo % bs else split.hi}; use "
                "another --tp size or a model stored with smaller blocks"
            )
        b0, b1 = split.lo // bs * qtype.type_size, split.hi // bs * qtype.type_size
        part = data[:, b0:b1]
        n = split.hi - split.lo
        new_shape = (n_rows, n) if len(raw.shape) == 2 else (n,)
    return RawTensor(raw.name, raw.ggml_type, new_shape, np.ascontiguousarray(part).reshape(-1))


@attrs.frozen
class ShardedModel:
    """A rank's loaded shard: a :class:`~tessera.files.load.Model` (no graph yet) and its plan."""

    model: Model
    plan: Any
    rank: int
    world_size: int


def read_model_file(path: str | os.PathLike[str]) -> Any:
    """The parsed GGUF model file (memory-mapped) a tensor-parallel rank loads from."""
    path = Path(path)
    if path.is_dir():
        raise TesseraError(
            f"tensor parallel loads GGUF files and '{path}' is a folder; convert it first with "
            "`tessera convert`"
        )
    gguf = read_gguf(path)
    if not gguf.architecture:
        raise ModelFileError(f"'{path}' has no general.architecture key; pass a model file")
    return gguf


def load_model_shard(
    path: str | os.PathLike[str],
    runtime: Any,
    rank: int,
    world_size: int,
    backend: Any = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    split_lm_head: bool | None = None,
) -> ShardedModel:
    """Load rank ``rank``'s shard of a GGUF model; the graph is built by :func:`attach`."""
    from tessera.text.tokenizer import Tokenizer

    path = Path(path)
    gguf = read_model_file(path)
    arch = runtime.architecture(gguf.architecture)
    shapes = {name: t.shape for name, t in gguf.tensors.items()}
    config = arch.config_from_gguf(gguf.metadata, shapes)
    if split_lm_head is None:
        split_lm_head = not flag(REPLICATE_LM_HEAD)
    plan = arch.tensor_parallel(config, rank, world_size, split_lm_head=split_lm_head)
    if plan is None:
        raise TesseraError(
            f"the {gguf.architecture} architecture plugin cannot run tensor-parallel; run "
            "without --tp"
        )
    raw = gguf.tensors
    qtypes = {name: runtime.quant_type(t.ggml_type, name) for name, t in raw.items()}
    if backend is None or isinstance(backend, str):
        backend = select_backend(runtime, arch, plan.local_config, backend, device, dtype)
    runtime.equip(backend)
    weights: dict[str, Any] = {}
    for local, (source, split) in plan.shards(raw).items():
        tensor = stored_tensor(raw[source], qtypes[source])
        if split is not None:
            tensor = slice_tensor(tensor, qtypes[source], split)
        weights[local] = backend.load_weight(tensor, qtypes[source])
    has_vocab = "tokenizer.ggml.model" in gguf.metadata
    model = Model(
        path=path,
        arch=arch,
        config=plan.local_config,
        backend=backend,
        weights=weights,
        graph=None,
        tokenizer=Tokenizer.from_gguf_metadata(gguf.metadata, runtime) if has_vocab else None,
        metadata=gguf.metadata,
        identity=deferred_identity(gguf.metadata, raw),
    )
    return ShardedModel(model, plan, rank, world_size)


def attach(shard: ShardedModel, comm: Communicator) -> Model:
    """Build the shard's graph over ``comm``; the model is then ready for a Context."""
    m = shard.model
    m.graph = shard.plan.build(m.weights, m.backend, comm)
    return m


@attrs.frozen
class Group:
    """A formed group: this rank's communicator and rank 0's rendezvous answer."""

    comm: Communicator
    answer: dict[str, Any]


def form_group(
    runtime: Any,
    shard: ShardedModel,
    master: str,
    *,
    communicator: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    extra: Mapping[str, Any] | None = None,
) -> Group:
    """Rendezvous at ``master``, agree on a communicator and connect it.

    ``extra`` (rank 0 only) is passed to every rank in the answer, e.g. context params.
    """
    host, port = parse_master(master)
    infos = runtime.communicators()
    device = str(shard.model.backend.device)
    caps = {
        "identity": shard.model.identity,
        "device": device,
        "probes": {name: info.probe(device).as_json() for name, info in infos.items()},
    }

    def decide(all_caps: list[dict[str, Any]]) -> dict[str, Any]:
        for r, c in enumerate(all_caps):
            if c["identity"] != caps["identity"]:
                raise CommunicatorError(
                    f"rank {r} loaded a different model than rank 0; give every rank the "
                    "same model file"
                )
        probes = [
            {n: CommunicatorProbe.from_json(p) for n, p in c["probes"].items()} for c in all_caps
        ]
        name, features, why = choose_communicator(infos, probes, communicator)
        return {
            "communicator": name,
            "features": list(features),
            "why": why,
            "port": free_port(host),
            "devices": [c["device"] for c in all_caps],
            **dict(extra or {}),
        }

    answer, local_host = rendezvous(
        shard.rank, shard.world_size, host, port, caps, timeout_s, decide
    )
    name = answer["communicator"]
    if name not in infos:
        raise CommunicatorError(
            f"rank 0 chose communicator '{name}', which is not installed on rank {shard.rank}"
        )
    spec = GroupSpec(
        rank=shard.rank,
        world_size=shard.world_size,
        host=host,
        port=int(answer["port"]),
        timeout_s=timeout_s,
        device=device,
        features=tuple(answer["features"]),
        local_host=local_host,
    )
    comm = infos[name].create(spec)
    log.info(
        "tensor parallel: rank %d/%d via %s (%s; %s)",
        shard.rank,
        shard.world_size,
        name,
        answer["why"],
        comm.path,
    )
    return Group(comm, answer)
