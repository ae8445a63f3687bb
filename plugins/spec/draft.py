"""``--spec-type draft``: a small draft model with the target's vocabulary (``-md FILE``).

The draft model runs greedily in a context of its own (same ``n_ctx`` as the target; its
ubatch from ``--spec-draft-n-ubatch``) and stops drafting when its probability for the next
token falls under ``--draft-p-min``. Its KV cache follows the target's history: at each
call the cells past the longest common prefix of what it evaluated and the new history
are removed (``KVCache.seq_rm``) and only the new tokens are evaluated. A draft model with
recurrent layers (Qwen3-Next) cannot cut its state back: its state after each history is
saved and put back when the next history continues that one (else it starts over).

For the bundled default model the trained draft ships as
``tessera/default_model/tessera-default-draft.gguf``; it is used when no ``-md`` is given
and the target is the default model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tessera.contract.spec import Draft, SpecDecoder, SpecDecoderInfo, SpecParams
from tessera.hookspecs import hookimpl
from tessera.plugins.spec.governor import governed

TESSERA_PLUGIN_API = 2

DEFAULT_DRAFT_NAME = "tessera-default-draft.gguf"


def default_draft_path(target_path: Path) -> Path | None:
    """The shipped draft for the bundled default model (its MTP variant included)."""
    from tessera.files.load import default_model_path

    here = default_model_path().parent
    if Path(target_path).resolve().parent == here.resolve():
        path = here / DEFAULT_DRAFT_NAME
        return path if path.exists() else None
    return None


def check_vocab(target: Any, draft: Any) -> None:
    """Refuse a draft model whose tokens differ from the target's (ids must mean the same)."""
    from tessera.errors import TesseraError

    way_out = "use a draft model trained with the target's tokenizer"
    if target.n_vocab != draft.n_vocab:
        raise TesseraError(
            f"the draft model '{draft.path.name}' has {draft.n_vocab} tokens but the target "
            f"'{target.path.name}' has {target.n_vocab}; {way_out}"
        )
    a = target.metadata.get("tokenizer.ggml.tokens")
    b = draft.metadata.get("tokenizer.ggml.tokens")
    if a is not None and b is not None and list(a) != list(b):
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        raise TesseraError(
            f"the draft model '{draft.path.name}' has another vocabulary than the target "
            f"'{target.path.name}' (token {i} differs); {way_out}"
        )


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits.astype(np.float64) - logits.max())
    return z / z.sum()


class DraftModelDecoder(SpecDecoder):
    """Greedy drafting with a small model; its cache tracks the target's history."""

    def __init__(self, ctx: Any, params: SpecParams, runtime: Any, n_seq_max: int = 1) -> None:
        from tessera.engine.context import Context, ContextParams
        from tessera.errors import TesseraError
        from tessera.files.load import load_model

        target = ctx.model
        path = params.model_draft or default_draft_path(target.path)
        if path is None:
            raise TesseraError(
                "speculative decoding with a draft model needs one: pass -md FILE (a small "
                "model with the target's vocabulary)"
            )
        backend = params.backend or target.backend.name
        # a bar on a terminal's stderr, as the target's load draws one
        self.model = load_model(path, runtime, backend, dtype=target.backend.dtype, progress=True)
        check_vocab(target, self.model)
        p = ctx.params
        self.ctx = Context(
            self.model,
            ContextParams(
                n_ctx=p.n_ctx,
                n_batch=p.n_batch,
                n_ubatch=params.n_ubatch_draft or p.n_ubatch,
                n_seq_max=n_seq_max,
                flash_attn=p.flash_attn,
            ),
        )
        self.p_min = params.p_min
        self.cached: list[int] = []  # tokens whose K/V are in the draft cache, seq 0
        #: Draft distribution for the token after the history of the last call.
        self.first_probs: np.ndarray | None = None
        #: A recurrent draft model's states after ``cached[:n]``, as ``(n, states)``.
        self.saved: tuple[int, Any] | None = None

    def begin(self, prompt: Sequence[int], seq_id: int) -> None:
        self.ctx.kv.clear()
        self.cached, self.saved = [], None

    def _rewind(self, common: int) -> int:
        """Where evaluation restarts when the cache cannot be cut at ``common``: the saved
        recurrent state, if the new history keeps what it holds, else the start."""
        if self.saved is not None and self.saved[0] <= common:
            n, states = self.saved
            self.ctx.recurrent.restore(states)
            self.ctx.kv.seq_rm(0, n)
            return n
        self.ctx.kv.seq_rm(0)
        return 0

    def evaluate_history(self, history: Sequence[int]) -> np.ndarray:
        """Bring the cache to ``history``; return the logits after its last token."""
        from tessera.engine.batch import Batch

        common = 0
        for a, b in zip(self.cached, history, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(history) - 1)  # the last token is evaluated for its logits
        if not self.ctx.kv.seq_rm(0, common):  # a recurrent state holds the old tail
            common = self._rewind(common)
        logits = None
        n_batch = self.ctx.params.n_batch
        for start in range(common, len(history), n_batch):
            chunk = history[start : start + n_batch]
            logits = self.ctx.decode(Batch.for_sequence(chunk, start, 0, "last"))[-1]
        self.cached = list(history)
        if self.ctx.recurrent is not None:
            self.saved = (len(history), self.ctx.recurrent.snapshot(np.array([0])))
        return logits

    def draft_with_probs(self, history: Sequence[int], n_max: int) -> tuple[Draft, list[float]]:
        """The greedy draft and the draft model's probability of each of its tokens."""
        from tessera.engine.batch import Batch

        if n_max <= 0:
            return Draft(()), []
        probs = softmax(self.evaluate_history(history))
        self.first_probs = probs
        tokens: list[int] = []
        chosen: list[float] = []
        while True:
            d = int(np.argmax(probs))
            if probs[d] < self.p_min:
                break
            tokens.append(d)
            chosen.append(float(probs[d]))
            if len(tokens) >= n_max or len(history) + len(tokens) >= self.ctx.n_ctx:
                break
            pos = len(history) + len(tokens) - 1
            logits = self.ctx.decode(Batch([d], [pos], [0], [True]))[0]
            self.cached.append(d)
            probs = softmax(logits)
        return Draft(tokens), chosen

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        return self.draft_with_probs(history, n_max)[0]


def create(ctx: Any, params: SpecParams, runtime: Any) -> DraftModelDecoder:
    return DraftModelDecoder(ctx, params, runtime)


@hookimpl
def tessera_register_spec_decoders(register):
    register(
        SpecDecoderInfo(
            "draft", governed(create), "a small draft model with the target's vocabulary (-md FILE)"
        )
    )
