"""``--spec-type mtp``: draft with the target's own multi-token-prediction (nextn) block.

Models such as GLM-4.5 ship MTP layers; llama.cpp's GGUF stores them as extra blocks after
the main ones: ``{arch}.nextn_predict_layers`` says how many, and ``block_count`` includes
them. Block ``blk.{n_layer}`` holds a decoder block of the model's own kind (GLM-4.5's:
its attention and routed experts) plus ``nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm``
and ``nextn.shared_head_norm`` (the embedding and output head are the model's own unless
``nextn.embed_tokens`` / ``nextn.shared_head_head`` are there, as llama.cpp reads them).
For the target's hidden state ``h_{p-1}`` and the token ``t_p`` at position ``p``, the
block computes::

    m = eh_proj(concat(enorm(embed(t_p)), hnorm(h_{p-1})))  ->  block  ->  m'
    logits(t_{p+1}) = output(shared_head_norm(m'))

The first draft token uses the target's real ``h``; further ones feed the block's own
back as ``h``. Which hidden state is ``h`` is the architecture's (its graph's
``nextn_normed_h``): GLM-4.5's is taken after ``output_norm`` and fed back after
``shared_head_norm``, as llama.cpp's ``t_h_nextn``; the bundled default model's head was
trained on ``h`` before the norms and ``m'``. The block attends over a KV cache of its own
(one layer, laid out as the model's), filled with the rows of every accepted position;
draft rows are removed from it after each verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessera.contract.spec import Draft, SpecDecoder, SpecDecoderInfo, SpecParams
from tessera.hookspecs import hookimpl
from tessera.plugins.spec.governor import governed

TESSERA_PLUGIN_API = 2


class MTPDecoder(SpecDecoder):
    """Drafts with the first nextn block of the target model."""

    needs_all_prompt_outputs = True

    def __init__(self, ctx: Any, params: SpecParams, runtime: Any) -> None:
        from tessera.engine.kv_cache import KVCache
        from tessera.errors import TesseraError

        model = ctx.model
        c = model.config
        if not getattr(c, "n_nextn", 0):
            arch = model.metadata.get("general.architecture", "?")
            raise TesseraError(
                f"the model '{model.path.name}' has no MTP layers ({arch}.nextn_predict_layers "
                "is missing or 0); use --spec-type draft -md FILE or --spec-type ngram"
            )
        graph = model.graph
        if not hasattr(graph, "hidden_sink") or not hasattr(graph, "nextn_block"):
            raise TesseraError(
                f"the {c.arch} architecture plugin does not expose its hidden state and MTP "
                "block, which --spec-type mtp needs; use --spec-type draft or ngram"
            )
        self.ctx, self.graph, self.c, self.b = ctx, graph, c, model.backend
        self.il = c.n_layer  # the first nextn block
        self.w = model.weights
        p = f"blk.{self.il}.nextn."
        self.embed = self.w.get(p + "embed_tokens.weight", self.w["token_embd.weight"])
        self.head_norm = self.w.get(p + "shared_head_norm.weight", self.w["output_norm.weight"])
        self.head = self.w.get(p + "shared_head_head.weight")
        self.eh_e, self.eh_h = self._split_eh_proj(model, runtime)
        # one cache layer, as the model lays out its others
        layout = [None] * self.il + [model.arch.kv_layout(c)[0]]
        self.kv = KVCache(self.b, layout, ctx.n_ctx, 1)
        self.h = np.zeros((ctx.n_ctx, c.n_embd), dtype=np.float32)  # target h by position
        self.n_done = 1  # MTP rows are in the cache for positions [1, n_done)
        self.p_min = params.p_min
        graph.hidden_sink = []

    def _split_eh_proj(self, model: Any, runtime: Any) -> tuple[Any, Any]:
        """eh_proj's halves for the embedding and the hidden state (two matmuls, no concat)."""
        from tessera.files.gguf import RawTensor, read_gguf

        name = f"blk.{self.il}.nextn.eh_proj.weight"
        if model.path.is_dir():  # an HF folder: its weights are float arrays already
            w = self.b.to_numpy(self.w[name])
        else:
            raw = read_gguf(model.path).tensors[name]
            w = runtime.quant_type(raw.ggml_type, name).dequantize_tensor(raw.data, raw.shape)
        f32 = runtime.quant_type(0)
        halves = []
        for part in (w[:, : self.c.n_embd], w[:, self.c.n_embd :]):
            part = np.ascontiguousarray(part, dtype=np.float32)
            halves.append(
                self.b.load_weight(
                    RawTensor(name, 0, part.shape, part.view(np.uint8).reshape(-1)), f32
                )
            )
        return halves[0], halves[1]

    def _drain(self) -> np.ndarray:
        rows = [self.b.to_numpy(x) for x in self.graph.hidden_sink]
        self.graph.hidden_sink = []
        return np.concatenate(rows, axis=0) if rows else np.zeros((0, self.c.n_embd))

    def _block(self, h: np.ndarray, tokens: Sequence[int], positions: np.ndarray) -> tuple:
        """Run the nextn block on rows ``(h_{p-1}, t_p)``; return (last row's logits, the
        ``h`` each row hands the next draft step)."""
        from tessera.contract.arch import ForwardInput

        b, w, c, p = self.b, self.w, self.c, f"blk.{self.il}."
        tokens = np.asarray(tokens, dtype=np.int32)
        seqs = np.zeros(len(tokens), dtype=np.int32)
        e = b.rms_norm(b.get_rows(self.embed, tokens), w[p + "nextn.enorm.weight"], c.rms_eps)
        hn = b.rms_norm(
            b.from_numpy(np.ascontiguousarray(h, dtype=np.float32)),
            w[p + "nextn.hnorm.weight"],
            c.rms_eps,
        )
        x = b.add(b.matmul(e, self.eh_e), b.matmul(hn, self.eh_h))
        cells = self.kv.find_slot(len(tokens), seqs)
        self.kv.commit(cells, positions, seqs)
        inp = ForwardInput(
            tokens=tokens,
            positions=np.asarray(positions, dtype=np.int32),
            output_rows=np.arange(len(tokens)),
            kv=self.kv.view(cells, positions, seqs, self.ctx.kv_path),
        )
        x = self.graph.nextn_block(self.il, x, inp)
        normed = b.rms_norm(x, self.head_norm, c.rms_eps)
        last = b.get_rows(normed, np.array([len(tokens) - 1]))
        logits = self.graph._logits(last) if self.head is None else b.matmul(last, self.head)
        return b.to_numpy(logits)[0], b.to_numpy(normed if self.graph.nextn_normed_h else x)

    def begin(self, prompt: Sequence[int], seq_id: int) -> None:
        self.kv.clear()
        # The prompt's rows came last; earlier ones are from decodes without this drafter.
        h = self._drain()[-len(prompt) :]
        self.h[: len(h)] = h
        self.n_done = 1

    def _catch_up(self, history: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Add the rows of positions [n_done, len(history)) to the MTP cache."""
        n = len(history)
        pos = np.arange(self.n_done, n, dtype=np.int32)
        logits, m = self._block(self.h[pos - 1], [history[i] for i in pos], pos)
        self.n_done = n
        return logits, m[-1:]

    def draft(self, history: Sequence[int], n_max: int) -> Draft:
        self.kv.seq_rm(0, self.n_done)  # draft rows of the last call
        if n_max <= 0 or len(history) < 2:
            return Draft(())
        logits, m = self._catch_up(history)
        tokens: list[int] = []
        while True:
            z = np.exp(logits.astype(np.float64) - logits.max())
            probs = z / z.sum()
            d = int(np.argmax(probs))
            if probs[d] < self.p_min:
                break
            tokens.append(d)
            pos = len(history) + len(tokens) - 1
            if len(tokens) >= n_max or pos >= self.ctx.n_ctx:
                break
            logits, m = self._block(m, [d], np.array([pos], dtype=np.int32))
        return Draft(tokens)

    def accepted(self, history: Sequence[int], n_drafted: int, n_accepted: int) -> None:
        # The target's batch evaluated positions [len_before - 1, ...]; keep the accepted rows.
        h = self._drain()
        first = len(history) - n_accepted - 2
        keep = h[: n_accepted + 1]
        self.h[first : first + len(keep)] = keep
        self.kv.seq_rm(0, self.n_done)

    def close(self) -> None:
        self.graph.hidden_sink = None


def create(ctx: Any, params: SpecParams, runtime: Any) -> MTPDecoder:
    return MTPDecoder(ctx, params, runtime)


@hookimpl
def tessera_register_spec_decoders(register):
    register(
        SpecDecoderInfo(
            "mtp",
            governed(create),
            "the target's own MTP/nextn layer ({arch}.nextn_predict_layers in the GGUF)",
        )
    )
