"""A context: one model, its KV cache and the decode loop over ubatches."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from tessera.contract.arch import ForwardInput
from tessera.contract.ops import Op
from tessera.engine.batch import Batch
from tessera.engine.kv_cache import KVCache
from tessera.engine.kv_types import cache_type, check_layout
from tessera.engine.memory import available_bytes, check_kv_cache_fits
from tessera.engine.recurrent import HybridCache, recurrent_state
from tessera.errors import ContextOverflowError, TesseraError
from tessera.switches import KV_ROWS_DISABLE, PRUNE_DISABLE, Choice, choose

log = logging.getLogger("tessera.engine.context")


def _positive(instance: Any, attribute: Any, value: int) -> None:
    if value < 1:
        raise TesseraError(f"{attribute.name} must be at least 1, got {value}")


def _flash_attn(instance: Any, attribute: Any, value: str) -> None:
    if value not in FLASH_ATTN_MODES:
        raise TesseraError(f"flash_attn must be one of on, off, auto; got '{value}'")


def _kv_type(instance: Any, attribute: Any, value: str) -> None:
    if value:
        cache_type(value, "")  # raises for a name that is no cache type


#: llama.cpp's -fa values. "auto": on where the backend supports ``attention_rows``.
FLASH_ATTN_MODES = ("on", "off", "auto")
#: The variables that force the dense-mask path and turn prefill pruning off, for
#: comparison (declared in :mod:`tessera.switches`).
KV_ROWS_DISABLE_ENV = KV_ROWS_DISABLE.name
PRUNE_DISABLE_ENV = PRUNE_DISABLE.name


@attrs.frozen
class ContextParams:
    """Sizes and switches of a context (llama.cpp's -c, -b, -ub, -np, -fa, --kv-unified,
    -ctk, -ctv)."""

    n_ctx: int = attrs.field(default=2048, validator=_positive)
    n_batch: int = attrs.field(default=2048, validator=_positive)
    n_ubatch: int = attrs.field(default=512, validator=_positive)
    n_seq_max: int = attrs.field(default=1, validator=_positive)
    flash_attn: str = attrs.field(default="auto", validator=_flash_attn)
    #: One cell pool for all sequences (tessera's default); False splits it per sequence.
    kv_unified: bool = True
    #: Prefill pruning in architectures with KV-shared layers (``--no-prune`` sets False).
    prune: bool = True
    #: Storage types of the K and V cache (``-ctk`` / ``-ctv``: f32, bf16, f16, q8_0; see
    #: :mod:`tessera.engine.kv_types`); "" keeps the backend's compute dtype.
    type_k: str = attrs.field(default="", converter=str.lower, validator=_kv_type)
    type_v: str = attrs.field(default="", converter=str.lower, validator=_kv_type)


def choose_kv_path(
    model: Any, params: ContextParams, backend: Any = None, attention: dict | None = None
) -> Choice:
    """``("rows" | "dense", why)``: the rows path needs a unified KV cache, flash attention
    on (or auto), the backend's probe saying yes, and no ``TESSERA_KV_ROWS_DISABLE``.

    Without a model (``tessera plugins``) pass ``backend`` and the attention parameters.
    """
    if model is not None:
        backend = model.backend
        attention = dict(model.arch.required_ops(model.config)).get("attention", {})

    def probe() -> tuple[bool, str]:
        if params.flash_attn == "off":
            return False, "-fa off"
        if not params.kv_unified:
            return False, "KV cache split per sequence (not unified)"
        rows_op = Op("attention_rows", attention or {}, backend.dtype)
        if not backend.supports(rows_op):
            return False, f"backend {backend.name} does not support attention_rows"
        if not backend.worth(rows_op):
            return False, f"backend {backend.name} prefers the dense mask"
        return True, (
            f"unified, -fa {params.flash_attn}, backend {backend.name} supports attention_rows"
        )

    return choose(KV_ROWS_DISABLE, probe, on="rows", off="dense")


def choose_prune(params: ContextParams) -> Choice:
    """``(allowed, why)`` for prefill pruning (rows that need no output skip the KV-shared
    layers): one sequence (n_seq_max 1), a unified KV cache, not ``--no-prune`` and no
    ``TESSERA_PRUNE_DISABLE``. Per ubatch, embeddings and intermediate outputs turn it off."""

    def probe() -> tuple[bool, str]:
        if not params.prune:
            return False, "--no-prune"
        if params.n_seq_max != 1:
            return False, f"n_seq_max {params.n_seq_max} > 1"
        if not params.kv_unified:
            return False, "KV cache split per sequence (not unified)"
        return True, "one sequence, unified KV"

    return choose(PRUNE_DISABLE, probe)


def kv_cache_types(backend: Any, layout: Any, params: ContextParams) -> tuple[str, str]:
    """The K and V cache types of a context (:mod:`tessera.engine.kv_types`; "" for the
    compute dtype), refused with a message when the layout or the backend cannot store them;
    recorded as the backend's ``"kv cache"`` placement."""
    dtype = backend.dtype
    type_k, type_v = (cache_type(t, dtype) for t in (params.type_k, params.type_v))
    check_layout(layout, type_k, type_v)
    for kind in {type_k, type_v} - {dtype}:
        if not backend.supports(Op("kv_cache", {"type": kind}, dtype)):
            raise TesseraError(
                f"backend {backend.name} cannot store a {kind} KV cache; drop -ctk/-ctv "
                f"{kind} (the cache is then {dtype}) or use --backend torch"
            )
    why = "-ctk/-ctv" if params.type_k or params.type_v else "the compute dtype"
    backend.record("kv cache", f"K {type_k}, V {type_v}", why)
    return ("" if type_k == dtype else type_k), ("" if type_v == dtype else type_v)


class Context:
    """Evaluates batches of tokens against a model, keeping their K/V in a unified cache."""

    def __init__(self, model: Any, params: ContextParams | None = None) -> None:
        self.model = model
        self.params = params or ContextParams()
        p = self.params
        self.n_ubatch = min(p.n_ubatch, p.n_batch)
        layout = model.arch.kv_layout(model.config)
        types = kv_cache_types(model.backend, layout, p)
        if model.backend.device == "cpu":  # GPU memory is not what /proc/meminfo counts
            check_kv_cache_fits(layout, p.n_ctx, model.backend.dtype, available_bytes(), *types)
        kv_args = (model.backend, layout, p.n_ctx, p.n_seq_max, p.kv_unified, *types)
        #: The recurrent layers' states (None without any), moved by the cache's sequence ops.
        self.recurrent = recurrent_state(model, p.n_seq_max)
        if self.recurrent is None:
            self.kv = KVCache(*kv_args)
        else:
            self.kv = HybridCache(*kv_args, recurrent=self.recurrent)
        #: "rows" or "dense" (see :func:`choose_kv_path`) and the reason, for reports.
        self.kv_path, self.kv_path_reason = choose_kv_path(model, p)
        model.backend.record("kv attention", self.kv_path, self.kv_path_reason)
        log.info(
            "context: n_ctx=%d n_batch=%d n_ubatch=%d n_seq_max=%d backend=%s dtype=%s",
            p.n_ctx,
            p.n_batch,
            self.n_ubatch,
            p.n_seq_max,
            model.backend.name,
            model.backend.dtype,
        )
        log.info("kv path: %s (%s)", self.kv_path, self.kv_path_reason)
        #: Host output buffers made so far, by kind ("logits" by decode, "embd" by encode):
        #: tests check that embedding mode never makes a logits buffer.
        self.output_buffers: Counter[str] = Counter()
        #: Whether ubatches may be pruned (see :func:`choose_prune`) and why.
        self.prune_ok, self.prune_reason = choose_prune(p)
        #: Set True while a caller reads intermediate-layer outputs: every row then runs
        #: through every layer (no pruning).
        self.layer_outputs_wanted = False
        prune_state = "allowed" if self.prune_ok else "off"
        model.backend.record("prefill pruning", prune_state, self.prune_reason)
        log.info("prefill pruning: %s (%s)", prune_state, self.prune_reason)

    @property
    def n_ctx(self) -> int:
        return self.params.n_ctx

    def _validate(self, batch: Batch) -> None:
        if len(batch) == 0:
            raise TesseraError("the batch is empty; give at least one token")
        if len(batch) > self.params.n_batch:
            raise TesseraError(
                f"the batch has {len(batch)} tokens but n_batch is {self.params.n_batch}; "
                "raise -b or send fewer tokens at once"
            )
        n_vocab = self.model.n_vocab
        if batch.tokens.min() < 0 or batch.tokens.max() >= n_vocab:
            raise TesseraError(f"token ids must be in [0, {n_vocab}); the batch has one outside")
        if batch.seq_ids.min() < 0 or batch.seq_ids.max() >= self.params.n_seq_max:
            raise TesseraError(
                f"sequence ids must be in [0, {self.params.n_seq_max}); raise -np for more "
                "parallel sequences"
            )
        if batch.positions.max() >= self.n_ctx:
            raise ContextOverflowError(
                f"position {int(batch.positions.max())} does not fit in a context of "
                f"{self.n_ctx} tokens; raise -c or shorten the input"
            )

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate ``batch``; return float32 logits ``(batch.n_outputs, n_vocab)`` in row order.

        On error no cell of this batch stays in the cache.
        """
        self._validate(batch)
        written: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        backend, rec = self.model.backend, self.recurrent
        saved = None if rec is None else rec.snapshot(np.unique(batch.seq_ids))
        try:
            for ub in batch.split(self.n_ubatch):
                cells = self.kv.find_slot(len(ub), ub.seq_ids)
                self.kv.commit(cells, ub.positions, ub.seq_ids)
                written.append(cells)
                inp = ForwardInput(
                    tokens=ub.tokens,
                    positions=ub.positions,
                    output_rows=np.flatnonzero(ub.output),
                    kv=self.kv.view(cells, ub.positions, ub.seq_ids, self.kv_path),
                    prune_ok=self.prune_ok and not self.layer_outputs_wanted,
                    recurrent=None if rec is None else rec.view(ub.seq_ids, ub.positions),
                )
                logits = self.model.graph.forward(inp)
                if len(inp.output_rows):
                    outputs.append(backend.to_numpy(logits))
                    self.output_buffers["logits"] += 1
        except BaseException:
            for cells in written:
                self.kv.release(cells)
            if saved is not None:
                rec.restore(saved)
            raise
        if not outputs:
            return np.zeros((0, self.model.n_vocab), dtype=np.float32)
        return np.concatenate(outputs, axis=0)

    def encode(
        self, batch: Batch, pooling: str = "mean", token_types: np.ndarray | None = None
    ) -> np.ndarray:
        """Evaluate ``batch`` in embedding mode and pool per sequence; the LM head never runs.

        Returns float32 ``(n_seq, n_embd)``, one row per sequence id present in the batch in
        ascending order (``mean``, ``cls``, ``last``), ``(n_seq, n_cls_out)`` classifier
        scores for ``rank``, or ``(batch.n_outputs, n_embd)`` for ``none``. ``token_types``
        (int32 ``(T,)``) gives BERT segments. The batch leaves nothing in the KV cache; see
        :mod:`tessera.engine.pooling`.
        """
        from tessera.engine.pooling import encode_batch

        self._validate(batch)
        return encode_batch(self, batch, pooling, token_types)

    # -- state files -----------------------------------------------------------------

    def save_state(
        self,
        path: str | os.PathLike[str],
        seq_id: int = 0,
        tokens: Sequence[int] = (),
        sampler: Any = None,
    ) -> None:
        """Write sequence ``seq_id`` (its KV cells), ``tokens`` (its history) and the RNG
        state of ``sampler`` to ``path`` (see :mod:`tessera.engine.state`)."""
        from tessera.engine.state import save_state

        rng = None if sampler is None else sampler.rng.bit_generator.state
        save_state(self, path, seq_id, tokens, rng)

    def load_state(
        self, path: str | os.PathLike[str], seq_id: int = 0, sampler: Any = None
    ) -> list[int]:
        """Replace sequence ``seq_id`` with the one saved in ``path``; return its token
        history and restore ``sampler``'s RNG. A refused file leaves the context unchanged."""
        from tessera.engine.state import load_state

        return load_state(self, path, seq_id, sampler).tokens
