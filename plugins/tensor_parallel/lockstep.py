"""Keeping ranks in lockstep: rank 0 drives, the other ranks repeat what it does.

Rank 0 runs the ordinary engine (tokenizer, sampler, generation loop) on a
:class:`TPContext`. Before each operation that the other ranks must repeat, it
broadcasts a command: a header of 8 int64 (``op, n`` and up to four arguments), then for some
ops one payload array. The other ranks run :func:`serve_worker`, which applies the same
commands to their own :class:`~tessera.engine.context.Context`, so every rank's KV cache picks
the same cells and every forward pass meets in the same collectives.

==========  =====================================  ==========================================
op          header                                 payload
==========  =====================================  ==========================================
1 context   n = bytes                              uint8 JSON of the ContextParams fields
2 decode    n = tokens                             int32 ``(4, n)``: tokens, positions,
                                                   seq_ids, output flags
3 kv        n = method (1 seq_rm, 2 seq_cp,        —
            3 seq_keep, 4 clear); up to 4 args
            after n (-1 for None)
4 stop      —                                      —
==========  =====================================  ==========================================
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import TesseraError

OP_CONTEXT, OP_DECODE, OP_KV, OP_STOP = 1, 2, 3, 4
KV_METHODS = {"seq_rm": 1, "seq_cp": 2, "seq_keep": 3, "clear": 4}
HEADER_LEN = 8


def _header(op: int, n: int = 0, *args: int) -> np.ndarray:
    h = np.zeros(HEADER_LEN, dtype=np.int64)
    h[0], h[1] = op, n
    h[2 : 2 + len(args)] = args
    return h


class _MirroredKV:
    """The KV cache of rank 0, telling the other ranks about each sequence operation."""

    def __init__(self, kv: Any, comm: Any) -> None:
        self._kv = kv
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    def _mirror(self, method: str, *args: int | None) -> None:
        values = [-1 if a is None else int(a) for a in args]
        self._comm.broadcast(_header(OP_KV, KV_METHODS[method], *values), 0)

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int | None = None) -> bool:
        self._mirror("seq_rm", seq_id, p0, p1)
        return self._kv.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int | None = None) -> bool:
        self._mirror("seq_cp", src, dst, p0, p1)
        return self._kv.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self._mirror("seq_keep", seq_id)
        self._kv.seq_keep(seq_id)

    def clear(self) -> None:
        self._mirror("clear")
        self._kv.clear()


class TPContext(Context):
    """Rank 0's context: a :class:`Context` whose work every other rank repeats."""

    def __init__(self, model: Any, params: ContextParams | None, comm: Any) -> None:
        super().__init__(model, params)
        self.comm = comm
        blob = np.frombuffer(json.dumps(attrs.asdict(self.params)).encode(), dtype=np.uint8)
        comm.broadcast(_header(OP_CONTEXT, len(blob)), 0)
        comm.broadcast(blob.copy(), 0)
        self.kv = _MirroredKV(self.kv, comm)

    def decode(self, batch: Batch) -> np.ndarray:
        self._validate(batch)  # refuse bad input here, before the other ranks see it
        body = np.stack([batch.tokens, batch.positions, batch.seq_ids, batch.output]).astype(
            np.int32
        )
        self.comm.broadcast(_header(OP_DECODE, len(batch)), 0)
        self.comm.broadcast(body, 0)
        return super().decode(batch)

    def encode(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TesseraError("embeddings are not tensor-parallel yet; run without --tp to embed")

    def save_state(self, *args: Any, **kwargs: Any) -> None:
        raise TesseraError(
            "context states of a tensor-parallel run cannot be saved yet; run without --tp "
            "to use --prompt-cache"
        )

    def load_state(self, *args: Any, **kwargs: Any) -> list[int]:
        raise TesseraError(
            "context states cannot be loaded into a tensor-parallel run yet; run without --tp "
            "to use --prompt-cache"
        )

    def stop(self) -> None:
        """Tell the other ranks to leave their loop (the last command of a run)."""
        self.comm.broadcast(_header(OP_STOP), 0)


def serve_worker(model: Any, comm: Any) -> int:
    """Repeat rank 0's commands until it says stop; return the number of decodes done."""
    ctx: Context | None = None
    n_decodes = 0
    while True:
        header = comm.broadcast(np.zeros(HEADER_LEN, dtype=np.int64), 0)
        op, n = int(header[0]), int(header[1])
        if op == OP_STOP:
            return n_decodes
        if op == OP_CONTEXT:
            blob = comm.broadcast(np.zeros(n, dtype=np.uint8), 0)
            ctx = Context(model, ContextParams(**json.loads(bytes(blob))))
        elif op == OP_DECODE and ctx is not None:
            body = comm.broadcast(np.zeros((4, n), dtype=np.int32), 0)
            ctx.decode(Batch(body[0], body[1], body[2], body[3].astype(bool)))
            n_decodes += 1
        elif op == OP_KV and ctx is not None:
            a, b, c, d = (int(v) for v in header[2:6])
            if n == KV_METHODS["seq_rm"]:
                ctx.kv.seq_rm(a, b, None if c < 0 else c)
            elif n == KV_METHODS["seq_cp"]:
                ctx.kv.seq_cp(a, b, c, None if d < 0 else d)
            elif n == KV_METHODS["seq_keep"]:
                ctx.kv.seq_keep(a)
            else:
                ctx.kv.clear()
        else:
            raise TesseraError(
                f"rank {comm.rank} got command {op} from rank 0 out of order; the ranks run "
                "different tessera versions — use the same one everywhere"
            )
