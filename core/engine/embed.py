"""The embedding engine: many inputs per forward, pooled vectors out, never the LM head.

This is the API ``tessera embed``, ``tessera rerank`` and the server's ``/v1/embeddings``
and ``/v1/rerank`` call::

    from tessera.engine.embed import Embedder
    emb = Embedder(model)                                  # a tessera.files.load.load_model result
    vecs = emb.embed([emb.tokenize(t) for t in texts])     # float32 (n, n_embd), L2-normalized
    vecs = emb.embed(token_lists, dims=256)                # MRL: truncate, then renormalize
    vecs, n_tokens = emb.embed_texts(["text", [101, 102]])  # OpenAI-style inputs + usage
    scores = emb.rerank("query", ["doc one", "doc two"])   # float32 (n_docs,)

- :class:`Embedder` ``(model, *, pooling=None, normalize=2, n_ctx=0, n_batch=2048,
  n_ubatch=0, n_seq_max=64, classifier_activation=None, mrl_dims=None)`` owns its own
  :class:`~tessera.engine.context.Context` (``n_ctx`` 0: the model's trained context, at most 4096
  for decoders; ``n_ubatch`` 0: ``n_batch`` for encoders, 512 for decoders). ``pooling``
  overrides the model's (``--pooling``); ``normalize`` is llama.cpp's ``--embd-normalize``:
  -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 Euclidean (default), p > 2 p-norm.
- :meth:`Embedder.embed` packs inputs into as few forwards as ``n_batch`` / ``n_seq_max`` /
  ``n_ubatch`` allow and pools each one. ``dims`` (Matryoshka) keeps the first ``dims``
  values and normalizes again; it must be between 1 and the model's width and, where the
  model lists its Matryoshka sizes (``mrl_dims`` or GGUF ``{arch}.embedding.mrl_dims``),
  one of them.
- :meth:`Embedder.rerank` scores (query, document) pairs formatted like the model's
  tokenizer pairs them (``[CLS] q [SEP] d [SEP]`` with segment ids for BERT) through the
  classifier head, then applies ``classifier_activation`` (``none``, ``sigmoid``,
  ``softmax``; default: the model's, else ``none`` for one label, ``softmax`` for more).
- :attr:`Embedder.pooling`, :attr:`Embedder.n_embd` (output width), :attr:`is_reranker`,
  :attr:`is_embedding_model`, :attr:`n_ctx` describe the model for ``/props``-style reports.
- Calls are serialized by a lock (one Context), so threads may share one Embedder.

Every bad input (empty input, too long for the context, wrong ``dims``, ranking with a
model that has no classifier) raises :class:`~tessera.errors.TesseraError` with one sentence.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.pooling import pooling_name
from tessera.errors import TesseraError

CLASSIFIER_ACTIVATIONS = ("none", "sigmoid", "softmax")


def normalize(x: np.ndarray, mode: int = 2) -> np.ndarray:
    """Rows of ``x`` normalized like llama.cpp's ``common_embd_normalize`` (see module doc)."""
    x = np.asarray(x, dtype=np.float32)
    if mode < 0:
        return x
    if mode == 0:
        norm = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif mode == 2:
        x64 = x.astype(np.float64)
        norm = np.sqrt((x64 * x64).sum(axis=-1, keepdims=True))
    else:  # the p-norm of the rows scaled by their largest value, so a large p cannot overflow
        a = np.abs(x.astype(np.float64))
        top = a.max(axis=-1, keepdims=True)
        scaled = np.divide(a, top, out=np.zeros_like(a), where=top > 0)
        norm = top * (scaled**mode).sum(axis=-1, keepdims=True) ** (1.0 / mode)
    out = np.zeros(x.shape, np.result_type(x, norm))  # rows of norm 0 stay 0, no warning
    return np.divide(x, norm, out=out, where=norm > 0).astype(np.float32)


_normalize = normalize  # the methods' parameter of the same name shadows it


def apply_activation(scores: np.ndarray, activation: str) -> np.ndarray:
    """``none``, ``sigmoid`` or ``softmax`` (over the labels of each row)."""
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-scores.astype(np.float64)))).astype(np.float32)
    if activation == "softmax":
        z = scores.astype(np.float64) - scores.max(axis=-1, keepdims=True)
        e = np.exp(z)
        return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)
    if activation != "none":
        raise TesseraError(
            f"unknown classifier activation '{activation}'; choose one of "
            f"{', '.join(CLASSIFIER_ACTIVATIONS)}"
        )
    return scores.astype(np.float32)


class Embedder:
    """Embeds and reranks with one loaded model (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        pooling: str | int | None = None,
        normalize: int = 2,
        n_ctx: int = 0,
        n_batch: int = 2048,
        n_ubatch: int = 0,
        n_seq_max: int = 64,
        classifier_activation: str | None = None,
        mrl_dims: Sequence[int] | None = None,
        kv_types: tuple[str, str] = ("", ""),  # a decoder's K/V cache types ("": compute dtype)
    ) -> None:
        self.model = model
        arch, config = model.arch, model.config
        self.pooling = pooling_name(arch.pooling_type(config) if pooling is None else pooling)
        self.normalize = int(normalize)
        self.causal = arch.causal_attention(config)
        limit = model.n_ctx_train if self.causal else int(getattr(config, "n_ctx_train", 512))
        #: Longest input (tokens) accepted.
        self.n_ctx = min(n_ctx, limit) if n_ctx > 0 else min(limit, 4096 if self.causal else limit)
        if n_ubatch <= 0:
            # encoders: one ubatch per forward, as llama.cpp wants (n_ubatch = n_batch)
            n_ubatch = 512 if self.causal else n_batch
        if not self.causal:
            n_ubatch = max(n_ubatch, self.n_ctx)  # an encoder sees a whole input at once
        n_batch = max(n_batch, n_ubatch)
        params = ContextParams(
            # a decoder's KV cache holds every input of one forward at once
            n_ctx=max(self.n_ctx, n_batch) if self.causal else self.n_ctx,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            n_seq_max=n_seq_max,
            type_k=kv_types[0],
            type_v=kv_types[1],
        )
        self.ctx = Context(model, params)
        self._lock = threading.Lock()
        self._width: int | None = None
        default_act = str(getattr(config, "classifier_activation", "") or "")
        labels = tuple(getattr(config, "classifier_labels", ()) or ())
        #: Number of classifier outputs (0: no classifier head).
        self.n_cls_out = len(labels)
        act = classifier_activation or default_act or ("softmax" if len(labels) > 1 else "none")
        apply_activation(np.zeros((1, 1)), act)  # rejects an unknown name now
        self.classifier_activation = act
        meta_dims = model.metadata.get(
            f"{model.metadata.get('general.architecture')}.embedding.mrl_dims"
        )
        self.mrl_dims = tuple(
            int(d) for d in (mrl_dims if mrl_dims is not None else meta_dims or ())
        )

    # -- what the model is ---------------------------------------------------------------

    @property
    def is_reranker(self) -> bool:
        return self.pooling == "rank"

    @property
    def is_embedding_model(self) -> bool:
        """True for models built to embed (an encoder, or a pooling in the metadata)."""
        return not self.causal or self.model.arch.pooling_type(self.model.config) != "none"

    @property
    def n_embd(self) -> int:
        """Width of one embedding (rank pooling: number of classifier outputs)."""
        if self.is_reranker:
            return self.n_cls_out
        if self._width is None:
            if any(n in self.model.weights for n in ("dense_2.weight", "dense_3.weight")):
                # projections after pooling set the width: one tiny forward measures it
                self._width = int(self._run([[0]], "mean").shape[1])
            else:
                self._width = int(self.model.config.n_embd)
        return self._width

    # -- embedding -----------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` with the model's special tokens (as llama-embedding does)."""
        if self.model.tokenizer is None:
            raise TesseraError("the model has no tokenizer; pass token ids or another model")
        return self.model.tokenizer.encode(text, add_special=True, parse_special=True)

    def _check_input(self, i: int, tokens: Sequence[int]) -> None:
        if len(tokens) == 0:
            raise TesseraError(f"input {i} is empty; every input needs at least one token")
        if len(tokens) > self.n_ctx:
            raise TesseraError(
                f"input {i} has {len(tokens)} tokens but the context holds {self.n_ctx}; "
                "shorten it or raise -c (up to the model's trained context)"
            )

    def _packs(self, lengths: Sequence[int]) -> list[list[int]]:
        """Input indices of each forward: at most n_seq_max inputs and n_batch tokens."""
        p = self.ctx.params
        packs: list[list[int]] = [[]]
        used = 0
        for i, n in enumerate(lengths):
            if packs[-1] and (len(packs[-1]) == p.n_seq_max or used + n > p.n_batch):
                packs.append([])
                used = 0
            packs[-1].append(i)
            used += n
        return packs

    def _run(
        self,
        token_lists: Sequence[Sequence[int]],
        pooling: str,
        types: Sequence[Sequence[int]] | None = None,
    ) -> np.ndarray:
        for i, tokens in enumerate(token_lists):
            self._check_input(i, tokens)
        out = []
        with self._lock:  # one Context: the server may call from several threads
            for pack in self._packs([len(t) for t in token_lists]):
                parts = [
                    Batch.for_sequence(token_lists[i], 0, s, "none") for s, i in enumerate(pack)
                ]
                batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
                tt = None if types is None else np.concatenate([types[i] for i in pack])
                tt = None if tt is None else tt.astype(np.int32)
                out.append(self.ctx.encode(batch, pooling, tt))
        return np.concatenate(out, axis=0)

    def check_dims(self, dims: int) -> None:
        """TesseraError unless ``dims`` is a size this model's embeddings can be cut to."""
        width = self.n_embd
        if self.mrl_dims and dims not in self.mrl_dims:
            raise TesseraError(
                f"dimensions={dims} is not one of this model's Matryoshka sizes "
                f"({', '.join(map(str, sorted(self.mrl_dims)))}); pick one of those"
            )
        if not 1 <= dims <= width:
            raise TesseraError(
                f"dimensions={dims} is outside 1..{width} (the model's embedding width); "
                "pick a smaller positive number"
            )

    def embed(
        self,
        token_lists: Sequence[Sequence[int]],
        dims: int | None = None,
        normalize: int | None = None,
    ) -> np.ndarray:
        """Pooled, normalized embeddings float32 ``(len(token_lists), n_embd or dims)``;
        ``normalize`` overrides the embedder's mode for this call."""
        if self.pooling in ("none", "rank"):
            raise TesseraError(
                f"pooling '{self.pooling}' gives no single vector per input; use --pooling "
                "mean, cls or last (or rerank for a reranker)"
            )
        if dims is not None:
            self.check_dims(int(dims))
        if not token_lists:
            return np.zeros((0, dims or self.n_embd), dtype=np.float32)
        vecs = self._run(token_lists, self.pooling)
        if dims is not None:
            vecs = vecs[:, : int(dims)]
        return _normalize(vecs, self.normalize if normalize is None else normalize)

    def embed_texts(
        self, inputs: Sequence[str | Sequence[int]], dims: int | None = None
    ) -> tuple[np.ndarray, int]:
        """:meth:`embed` for OpenAI-style inputs (texts or token id lists); also returns
        the number of tokens evaluated (``usage.prompt_tokens``)."""
        token_lists = [self.tokenize(x) if isinstance(x, str) else list(x) for x in inputs]
        return self.embed(token_lists, dims), sum(len(t) for t in token_lists)

    def token_embeddings(self, tokens: Sequence[int], normalize: int | None = None) -> np.ndarray:
        """Per-token hidden states ``(len(tokens), n_embd)`` of one input (pooling none),
        each row normalized (``normalize`` overrides the mode; -1 keeps them raw)."""
        self._check_input(0, tokens)
        batch = Batch.for_sequence(tokens, 0, 0, "all")
        with self._lock:
            hidden = self.ctx.encode(batch, "none")
        return _normalize(hidden, self.normalize if normalize is None else normalize)

    # -- reranking -----------------------------------------------------------------------

    def pair_tokens(self, query: str, document: str) -> tuple[list[int], list[int]]:
        """Tokens and segment ids of one (query, document) pair: the query with the
        tokenizer's specials (``[CLS] q [SEP]``), then the document without the leading
        BOS (``d [SEP]``) in segment 1."""
        tok = self.model.tokenizer
        q = self.tokenize(query)
        d = self.tokenize(document)
        if tok.add_bos and d and d[0] == tok.bos_id:
            d = d[1:]
        return q + d, [0] * len(q) + [1] * len(d)

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        """Relevance of each document to ``query``: float32 ``(n_docs,)`` for a one-label
        classifier, ``(n_docs, n_labels)`` otherwise, after ``classifier_activation``."""
        if not self.is_reranker:
            raise TesseraError(
                f"this model pools '{self.pooling}', not 'rank': it is not a reranker; use a "
                "reranker model (a classifier head) or --pooling rank if it has one"
            )
        if not documents:
            return np.zeros(0, dtype=np.float32)
        pairs = [self.pair_tokens(query, d) for d in documents]
        scores = self._run([p[0] for p in pairs], "rank", [p[1] for p in pairs])
        scores = apply_activation(scores, self.classifier_activation)
        return scores[:, 0] if scores.shape[1] == 1 else scores
