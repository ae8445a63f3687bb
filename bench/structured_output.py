"""Per-token cost of structured output (the grammar plugin on llguidance) next to plain
decoding, in one run, on the Qwen2 0.5B shape with Qwen2's real 151,936-token vocabulary.

    .venv/bin/python bench/structured_output.py [--tokens 64] [--backend torch]
    .venv/bin/python bench/structured_output.py --logits-only [--tokens 300]

Each step decodes one token with the random-weight model (``tessera.testing.shapes``), then
times the plain sampler and the constrained ``sample`` + ``accept`` on the same logits row;
the constrained token is the one fed back, so the grammar advances as in a real generation
(a finished document starts a new one). The overhead column is the constraint's extra time
over the plain sampler, as a share of a plain decode step (model + sampler).
``--logits-only`` skips the model (random logits) and reports the constraint's time alone.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from tessera.engine.sampling import Sampler, SamplerParams
from tessera.plugin_manager import Runtime
from tessera.text.tokenizer import Tokenizer

VOCAB = Path(__file__).resolve().parents[1] / "tests" / "data" / "vocab" / "ggml-vocab-qwen2.gguf"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "tags"],
}
KINDS = {
    "json_object": None,
    "json_schema": SCHEMA,
    "gbnf": 'root ::= "(" [a-z]+ ("," [a-z]+)* ")"',
    "regex": r"[A-Z][a-z]+( [a-z]+){0,12}\.",
}


class Stepper:
    """Logits rows one token at a time: the random-weight model, or random numbers."""

    def __init__(self, runtime: Runtime, n_vocab: int, backend: str | None, model: bool) -> None:
        self.n_vocab, self.rng, self.ctx = n_vocab, np.random.default_rng(0), None
        if model:
            from tessera.engine.context import Context, ContextParams
            from tessera.testing.shapes import random_model

            m = random_model(runtime, "qwen2-0.5b", backend, n_vocab=n_vocab, progress=True)
            self.ctx = Context(m, ContextParams(n_ctx=4096))
        self.pos = 0

    def first(self, prompt: list[int]) -> np.ndarray:
        if self.ctx is None:
            return self.next(0)
        from tessera.engine.generate import prefill

        self.pos = len(prompt)
        return prefill(self.ctx, prompt)

    def next(self, token: int) -> np.ndarray:
        if self.ctx is None:
            return self.rng.normal(scale=3.0, size=self.n_vocab).astype(np.float32)
        from tessera.engine.batch import Batch

        row = self.ctx.decode(Batch([token], [self.pos], [0], [True]))[0]
        self.pos += 1
        return np.asarray(row, dtype=np.float32)


def run(args: argparse.Namespace) -> None:
    runtime = Runtime()
    tok = Tokenizer.from_path(VOCAB)
    t = time.perf_counter()
    factories = {k: runtime.constraint_kind(k).compile(v, tok) for k, v in KINDS.items()}
    print(f"vocabulary tables + {len(KINDS)} grammars: {time.perf_counter() - t:.2f} s")
    stepper = Stepper(runtime, tok.n_vocab, args.backend, not args.logits_only)
    params = SamplerParams(temperature=1.0, seed=0)
    print("| kind | tokens | decode ms | plain sample ms | constrained ms | overhead |")
    print("|---|---|---|---|---|---|")
    for kind, factory in factories.items():
        plain, constrained = Sampler(params), Sampler(params)
        constraint, history = factory(), []
        logits = stepper.first(tok.encode("Answer: ", add_special=False))
        t_decode = t_plain = t_constrained = 0.0
        for _ in range(args.tokens):
            t0 = time.perf_counter()
            plain.sample(logits, history)
            t1 = time.perf_counter()
            token = constraint.sample(constrained, logits, history)
            if not tok.is_eog(token):
                constraint.accept(token)
            t2 = time.perf_counter()
            if tok.is_eog(token) or constraint.complete:
                constraint, history = factory(), []  # the next document
            else:
                history.append(token)
            logits = stepper.next(token)
            t_decode += time.perf_counter() - t2
            t_plain, t_constrained = t_plain + t1 - t0, t_constrained + t2 - t1
        n = args.tokens
        # without a model the step is the plain sampler alone
        step = t_plain / n if args.logits_only else (t_decode + t_plain) / n
        extra = (t_constrained - t_plain) / n
        decode = "-" if args.logits_only else f"{1e3 * t_decode / n:.1f}"
        print(
            f"| {kind} | {n} | {decode} | {1e3 * t_plain / n:.2f} | "
            f"{1e3 * t_constrained / n:.2f} | {100 * extra / step:+.1f}% |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="decoded tokens per kind")
    parser.add_argument("--backend", default=None, help="backend of the model (default: best)")
    parser.add_argument("--logits-only", action="store_true", help="random logits, no model")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
