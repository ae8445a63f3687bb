"""Cost of JSON-constrained sampling per token, next to the plain sampler, in one run.

    .venv/bin/python bench/json_constraint.py [--docs 20] [--synthetic 32000 128000]

Drives whole generations with random logits (nudged towards ``"``, ``}`` and ``]`` so
documents end) through the default model's vocabulary and through synthetic byte-level
vocabularies of the given sizes, and reports per path: microseconds per token for the plain
``Sampler.sample``, the constrained sampler with rejection on and off, the cold cost of the
first full mask (a trie walk over the vocabulary) and how many parser-state keys got cached.
The same logits sequence feeds every path. A second row set takes its logits from the trained
default model (numpy backend) instead, where the rejection route meets realistic logits.
"""

from __future__ import annotations

import argparse
import random
import time

import attrs
import numpy as np

from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import default_model_path
from tessera.plugins.json_constraint.constraint import JsonConstraintFactory
from tessera.text.tokenizer import Tokenizer


class SyntheticVocab:
    """A byte-level-BPE-shaped vocabulary: all 256 bytes, JSON punctuation pairs, digit groups
    of up to three digits, some multi-byte characters and words made of random syllables, with
    and without a leading space (real tokenizers' files cannot be downloaded here)."""

    def __init__(self, size: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        punct = ['{"', '"}', '":', '",', '["', '"]', '": "', '", "', "},", "],", "{}", "[]", "}}"]
        pieces = {bytes([b]) for b in range(256)} | {p.encode() for p in punct}
        pieces |= {str(i).encode() for i in range(1000)}
        pieces |= {c.encode() for c in "éèüßçñ東京都市大学日本語データ値名前"}
        syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"] + ["th", "ing", "er"]
        while len(pieces) < size - 1:
            word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
            lead = rng.choice(["", " ", " ", "_"])
            pieces.add((lead + (word.capitalize() if rng.random() < 0.2 else word)).encode())
        self.pieces = sorted(pieces)[: size - 1] + [b"<eog>"]

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    def token_to_bytes(self, i: int) -> bytes:
        return self.pieces[i]

    def is_eog(self, i: int) -> bool:
        return i == len(self.pieces) - 1

    is_special = is_eog


def generate(factories, samplers, rows, seed, times) -> int:
    """One document per path from the same logits sequence; returns the steps taken."""
    constraints = {key: f.new() for key, f in factories.items()}
    step = 0
    while not all(c.finished for c in constraints.values()) and step < 2000:
        logits = rows[(seed * 7 + step) % len(rows)]
        t = time.perf_counter()
        samplers["plain"].sample(logits)
        times["plain"] += time.perf_counter() - t
        for key, c in constraints.items():
            if not c.finished:
                t = time.perf_counter()
                c.accept(c.sample(samplers[key], logits))
                times[key] += time.perf_counter() - t
        step += 1
    return step


def run(tokenizer, docs: int, params: SamplerParams) -> None:
    factories = {
        "rejection": JsonConstraintFactory(tokenizer, rejection=True),
        "mask": JsonConstraintFactory(tokenizer, rejection=False),
    }
    n = factories["mask"].n_vocab
    in_string = factories["mask"].new()
    in_string.state.feed(b'{"')
    t0 = time.perf_counter()
    in_string.allowed_mask()
    cold = time.perf_counter() - t0
    bias = np.zeros(n, dtype=np.float32)
    for i, data in enumerate(factories["mask"].token_bytes):
        if data and any(c in data for c in b'"}]'):
            bias[i] = 3.0
    rng = np.random.default_rng(0)
    rows = [rng.normal(scale=2.0, size=n).astype(np.float32) + bias for _ in range(64)]
    # The first pass fills the per-tokenizer mask cache; the second is the steady state a
    # server reaches after a few requests.
    for label in ("cold cache", "warm cache"):
        times = {"plain": 0.0, "rejection": 0.0, "mask": 0.0}
        tokens = 0
        for seed in range(docs):
            samplers = {k: Sampler(attrs.evolve(params, seed=seed)) for k in times}
            tokens += generate(factories, samplers, rows, seed, times)
        us = {k: 1e6 * v / tokens for k, v in times.items()}
        print(
            f"| {n} | {label} | {tokens} | {us['plain']:.0f} | {us['rejection']:.0f} "
            f"({us['rejection'] / us['plain']:.2f}x) | {us['mask']:.0f} "
            f"({us['mask'] / us['plain']:.2f}x) | {cold * 1e3:.0f} | "
            f"{len(factories['mask']._masks)} |"
        )


def run_model(docs: int, params: SamplerParams, max_tokens: int = 64) -> None:
    """Logits from the trained default model; every path samples from the same logits and
    all constraints advance with the mask-only path's token, so they see the same states."""
    from tessera.engine.batch import Batch
    from tessera.engine.context import Context, ContextParams
    from tessera.engine.generate import prefill
    from tessera.files.load import load_model
    from tessera.plugin_manager import Runtime

    model = load_model(default_model_path(), Runtime(), "numpy")
    tok = model.tokenizer
    factories = {
        "rejection": JsonConstraintFactory(tok, rejection=True),
        "mask": JsonConstraintFactory(tok, rejection=False),
    }
    prompt = tok.encode("Here is the answer as JSON: ")
    for label in ("cold cache", "warm cache"):
        times = {"plain": 0.0, "rejection": 0.0, "mask": 0.0}
        tokens = 0
        for seed in range(docs):
            ctx = Context(model, ContextParams(n_ctx=256))
            logits = prefill(ctx, prompt)
            samplers = {k: Sampler(attrs.evolve(params, seed=seed)) for k in times}
            constraints = {k: f.new() for k, f in factories.items()}
            out: list[int] = []
            while len(out) < max_tokens:
                t = time.perf_counter()
                samplers["plain"].sample(logits, out)
                times["plain"] += time.perf_counter() - t
                picked = {}
                for key, c in constraints.items():
                    t = time.perf_counter()
                    picked[key] = c.sample(samplers[key], logits, out)
                    times[key] += time.perf_counter() - t
                tokens += 1
                token = picked["mask"]
                for c in constraints.values():
                    c.accept(token)
                if constraints["mask"].finished:
                    break
                out.append(token)
                logits = ctx.decode(Batch([token], [len(prompt) + len(out) - 1], [0], [True]))[0]
        us = {k: 1e6 * v / tokens for k, v in times.items()}
        print(
            f"| {tok.n_vocab} (default model's logits) | {label} | {tokens} | "
            f"{us['plain']:.0f} | {us['rejection']:.0f} ({us['rejection'] / us['plain']:.2f}x) | "
            f"{us['mask']:.0f} ({us['mask'] / us['plain']:.2f}x) | - | "
            f"{len(factories['mask']._masks)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--synthetic", type=int, nargs="*", default=[32000, 128000])
    args = ap.parse_args()
    params = SamplerParams()  # llama.cpp's default chain: top-k 40, top-p 0.95, min-p 0.05
    print(
        "| n_vocab | pass | steps | plain us/tok | rejection us/tok | mask-only us/tok "
        "| cold in-string mask ms | cached keys |"
    )
    print("|---|---|---|---|---|---|---|---|")
    run(Tokenizer.from_path(default_model_path()), args.docs, params)
    run_model(args.docs, params)
    for size in args.synthetic:
        run(SyntheticVocab(size), args.docs, params)


if __name__ == "__main__":
    main()
