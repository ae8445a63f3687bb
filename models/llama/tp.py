"""Megatron-style tensor parallelism for the llama family (Llama, Qwen2, Qwen3).

With ``N`` ranks, rank ``r`` holds:

- attention: query heads ``[r*Hq/N, (r+1)*Hq/N)`` and KV heads ``[r*Hkv/N, ...)`` — the
  rows of ``attn_q/k/v`` (and their biases; column-parallel) — and the matching input
  columns of ``attn_output`` (row-parallel). GQA groups stay on one rank because ``Hkv``
  divides by ``N``. Its KV cache holds only its KV heads.
- FFN: rows ``[r*F/N, (r+1)*F/N)`` of ``ffn_gate`` / ``ffn_up`` (column-parallel) and the
  same columns of ``ffn_down`` (row-parallel).
- norms and the token embedding: replicated (a lookup costs nothing to repeat, and
  splitting it would add an all-reduce per ubatch);
- LM head: split by vocabulary rows (``ceil(V/N)`` each, the last padded with zero
  rows); the logits of the output rows are all-gathered. ``split_lm_head=False``
  (``TESSERA_TP_REPLICATE_LM_HEAD=1``) keeps it whole on every rank instead.

Per layer there is one all-reduce after attention and one after the FFN, each of
``T * n_embd`` values; a bias of ``attn_output`` is kept on rank 0 only, so the sum adds
it once. The forward pass is :class:`tessera.models.llama.graph.LlamaGraph`'s own, run on the
rank's local config; only the partial sums and the head differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from tessera.contract.tp import Split
from tessera.errors import TesseraError
from tessera.models.llama.config import LlamaConfig
from tessera.models.llama.graph import LlamaGraph

#: Weights split by output rows (column-parallel), by head or FFN row.
_HEAD_ROWS = {"attn_q": "q", "attn_k": "kv", "attn_v": "kv"}
_FFN_ROWS = ("ffn_gate.weight", "ffn_up.weight")


class LlamaTensorParallel:
    """The plan of rank ``rank`` of ``world_size`` (see the module docstring)."""

    def __init__(
        self, config: LlamaConfig, rank: int, world_size: int, split_lm_head: bool = True
    ) -> None:
        c, n = config, world_size
        if c.fused_qkv or c.fused_gate_up or c.qk_norm_full:
            raise TesseraError(
                f"tensor parallel does not split {c.arch} models yet (fused Q/K/V and gate/up "
                "tensors, or a Q/K norm over all heads); run it without --tp"
            )
        for what, value in (
            ("query heads", c.n_head),
            ("KV heads", c.n_head_kv),
            ("FFN width", c.n_ff),
        ):
            if value % n:
                raise TesseraError(
                    f"this model has {c.n_head} query heads, {c.n_head_kv} KV heads and FFN "
                    f"width {c.n_ff}; {what} ({value}) do not divide by --tp {n}. Use a rank "
                    "count that divides all three"
                )
        self.c, self.rank, self.n = c, rank, n
        self.split_lm_head = split_lm_head and n > 1
        self.vocab_chunk = -(-c.n_vocab // n)
        self.local_config = attrs.evolve(
            c, n_head=c.n_head // n, n_head_kv=c.n_head_kv // n, n_ff=c.n_ff // n
        )

    def _rows(self, per_rank: int) -> Split:
        return Split(0, self.rank * per_rank, (self.rank + 1) * per_rank)

    def shards(self, names: Iterable[str]) -> dict[str, tuple[str, Split | None]]:
        c, lc = self.c, self.local_config
        q_rows, kv_rows = lc.n_head * c.head_dim, lc.n_head_kv * c.head_dim
        out: dict[str, tuple[str, Split | None]] = {}
        for name in names:
            base, _, kind = name.rpartition(".")
            short = base.rpartition(".")[2]
            if short in _HEAD_ROWS and kind in ("weight", "bias"):
                out[name] = (name, self._rows(q_rows if _HEAD_ROWS[short] == "q" else kv_rows))
            elif name.endswith(_FFN_ROWS):
                out[name] = (name, self._rows(lc.n_ff))
            elif name.endswith("attn_output.weight"):
                out[name] = (name, Split(1, self.rank * q_rows, (self.rank + 1) * q_rows))
            elif name.endswith("ffn_down.weight"):
                out[name] = (name, Split(1, self.rank * lc.n_ff, (self.rank + 1) * lc.n_ff))
            elif name.endswith("attn_output.bias"):
                if self.rank == 0:  # added once, before the sum
                    out[name] = (name, None)
            elif name == "output.weight" and self.split_lm_head:
                out[name] = (name, self._rows(self.vocab_chunk))
            else:
                out[name] = (name, None)
        if self.split_lm_head and "output.weight" not in out:  # tied: cut the embedding
            out["output.weight"] = ("token_embd.weight", self._rows(self.vocab_chunk))
        return out

    def build(self, weights: Mapping[str, Any], backend: Any, comm: Any) -> LlamaTPGraph:
        return LlamaTPGraph(self, weights, backend, comm)


class LlamaTPGraph(LlamaGraph):
    """:class:`LlamaGraph` on a rank's shard: partial sums meet in two all-reduces a layer."""

    def __init__(
        self, plan: LlamaTensorParallel, weights: Mapping[str, Any], backend: Any, comm: Any
    ) -> None:
        super().__init__(plan.local_config, weights, backend)
        self.plan = plan
        self.comm = comm

    def _attention(self, il: int, x: Any, inp: Any) -> Any:
        return self.comm.all_reduce(super()._attention(il, x, inp))

    def _ffn(self, il: int, h: Any) -> Any:
        return self.comm.all_reduce(super()._ffn(il, h))

    def _logits(self, x: Any) -> Any:
        local = super()._logits(x)  # (T, vocab_chunk) of this rank's vocabulary rows
        n_rows = local.shape[0]
        if not self.plan.split_lm_head or n_rows == 0:  # every rank has the same n_rows
            return local
        gathered = self.comm.all_gather(local)  # (N, T, vocab_chunk)
        logits = gathered.swapaxes(0, 1).reshape(n_rows, self.plan.n * self.plan.vocab_chunk)
        return logits[:, : self.plan.c.n_vocab]
