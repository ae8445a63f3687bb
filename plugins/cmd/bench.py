"""``tessera bench``: prompt processing and generation speed, like llama.cpp's llama-bench.

Every combination of the list flags (``-b``, ``-ub``, ``-t``, ``-fa``, ``--prune``, ``-ctk``,
``-ctv``) is one instance; every instance runs the tests ``pp<n>`` for each ``-p`` value and
``tg<n>`` for each ``-n`` value (``0`` skips that kind) at each ``-d`` depth, ``-r`` times,
and reports mean ± standard deviation of tokens/s, as llama-bench:

- ``pp<n>``: ``n`` random tokens decoded in ``-b`` chunks, logits for the last token only
  (so KV-shared layers can be pruned);
- ``tg<n>``: ``n`` tokens decoded one at a time;
- both into an empty cache, or (``pp<n> @ d<d>``) after ``d`` random tokens decoded first,
  untimed: speed at a depth of context.

A warm-up pp and tg run first (``--no-warmup`` skips them). The tests run one after the
other; within a test, repetitions are interleaved across instances (rep 1 of every
instance, then rep 2 in reverse order ...), so on a shared machine load drift hits every
instance alike: ``--prune on,off`` is an A/B. A test's rows (one per instance) are printed
as soon as its repetitions are done, not all at the end.
Models: ``-m FILE`` (GGUF or HF folder), or random weights of named shapes
(``--shape gemma4-e2b,gemma4-e4b``, :mod:`tessera.testing.shapes`).
Output ``-o md|json|jsonl|csv`` with llama-bench's field names (avg_ts, stddev_ts, ...).
Mixture-of-experts placement takes the run command's flags (``--cpu-moe``, ``-ncmoe N``,
``--moe-cache-mib N``); with an expert cache, each test also reports the cache's counters
over its timed runs (``moe_cache_hits``, ``moe_cache_misses``, ``moe_cache_hit_rate``,
``moe_cache_evictions``, ``moe_cache_bytes_moved``). The cache is not emptied between
runs: it stays warm, as it does when serving.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time
from typing import Any

import attrs
import numpy as np

from tessera.contract.commands import Command
from tessera.engine.kv_types import KV_TYPE_BYTES
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl
from tessera.plugins.cmd.bench_output import OUTPUT_FORMATS, Printer, test_record

TESSERA_PLUGIN_API = 2

_SWITCH = {"on": "on", "1": "on", "off": "off", "0": "off", "auto": "auto"}


def _list(kind: Any, allowed: dict[str, str] | None = None, low: int = 0) -> Any:
    """An argparse ``type``: a comma list of ``kind`` values (each >= ``low``) or of the
    ``allowed`` words."""

    def parse(text: str) -> list[Any]:
        items = [v.strip() for v in text.split(",") if v.strip()]
        try:
            values = [allowed[v] if allowed else kind(v) for v in items]
        except (ValueError, KeyError):
            what = ", ".join(sorted(set(allowed))) if allowed else "integers"
            raise argparse.ArgumentTypeError(
                f"expected a comma list of {what}, got '{text}'"
            ) from None
        if not values or (not allowed and min(values) < low):
            raise argparse.ArgumentTypeError(f"expected values >= {low}, got '{text}'")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tessera.cli.args import add_moe_arguments
    from tessera.testing.shapes import DEFAULT_SHAPE_VOCAB, SHAPES

    g = parser.add_argument_group("bench (llama-bench flags; lists are comma-separated)")
    g.add_argument("-m", "--model", default=None, help="GGUF file or HF folder")
    g.add_argument(
        "--shape",
        type=lambda t: [s.strip() for s in t.split(",") if s.strip()],
        default=None,
        help=f"random-weight model(s) of a named shape: {', '.join(SHAPES)}",
    )
    g.add_argument(
        "--shape-vocab", type=int, default=DEFAULT_SHAPE_VOCAB, help="vocabulary of --shape models"
    )
    g.add_argument("-p", "--n-prompt", type=_list(int), default=[512], help="prompt sizes (pp)")
    g.add_argument("-n", "--n-gen", type=_list(int), default=[128], help="generation sizes (tg)")
    g.add_argument(
        "-d", "--n-depth", type=_list(int), default=[0], help="tokens in the cache before a test"
    )
    g.add_argument("-r", "--repetitions", type=int, default=5, help="runs of each test")
    g.add_argument("-t", "--threads", type=_list(int), default=[0], help="threads (0 = default)")
    g.add_argument(
        "-b", "--batch-size", type=_list(int, low=1), default=[2048], help="logical batch"
    )
    g.add_argument(
        "-ub", "--ubatch-size", type=_list(int, low=1), default=[512], help="physical batch"
    )
    g.add_argument(
        "-fa", "--flash-attn", type=_list(str, _SWITCH), default=["auto"], help="on,off,auto"
    )
    g.add_argument(
        "--prune", type=_list(str, _SWITCH), default=["on"], help="prefill pruning: on,off"
    )
    g.add_argument("--no-prune", action="store_true", help="same as --prune off")
    for part in ("k", "v"):
        kinds = _list(str, dict(zip(KV_TYPE_BYTES, KV_TYPE_BYTES, strict=True)))
        g.add_argument(f"-ct{part}", f"--cache-type-{part}", type=kinds, default=[""],
                       help=f"{part.upper()} cache types (default: the compute dtype)")  # fmt: skip
    g.add_argument("-o", "--output", choices=OUTPUT_FORMATS, default="md", help="output format")
    g.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs")
    g.add_argument("--backend", default=None, help="backend plugin (default: best available)")
    g.add_argument("--device", default=None, help="device, e.g. cpu or cuda:0")
    g.add_argument("--dtype", default=None, choices=["f32", "bf16", "f16"], help="compute dtype")
    g.add_argument("-s", "--seed", type=int, default=0, help="seed of the random tokens")
    add_moe_arguments(parser)


@attrs.frozen
class Instance:
    """One combination of the list flags (llama-bench's cmd_params_instance)."""

    n_batch: int
    n_ubatch: int
    n_threads: int
    flash_attn: str
    prune: str
    type_k: str = ""
    type_v: str = ""


@attrs.define
class Test:
    """One test of one instance and its timings in nanoseconds."""

    instance: Instance
    n_prompt: int
    n_gen: int
    samples_ns: list[int] = attrs.field(factory=list)
    #: Tokens decoded into the cache before the timed part (llama-bench's -d), untimed.
    n_depth: int = 0
    pruned: bool = False
    kv_path: str = ""
    prune_reason: str = ""
    #: Expert-cache counters summed over the timed runs; None without an expert cache.
    moe_cache: dict[str, int] | None = None

    @property
    def name(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name  # llama-bench's names


def instances(args: argparse.Namespace) -> list[Instance]:
    prune = ["off"] if args.no_prune else args.prune
    if "auto" in prune:
        raise TesseraError("--prune takes on or off, not auto")
    combos = itertools.product(
        args.batch_size, args.ubatch_size, args.threads, args.flash_attn, prune,
        getattr(args, "cache_type_k", [""]), getattr(args, "cache_type_v", [""]),
    )  # fmt: skip
    return [Instance(*c) for c in combos]


def _context(model: Any, inst: Instance, n_ctx: int) -> Any:
    from tessera.engine.context import Context, ContextParams

    if inst.n_ubatch < 1 or inst.n_batch < 1:
        raise TesseraError("-b and -ub must be at least 1")
    params = ContextParams(
        n_ctx=n_ctx,
        n_batch=inst.n_batch,
        n_ubatch=min(inst.n_ubatch, inst.n_batch),
        flash_attn=inst.flash_attn,
        prune=inst.prune == "on",
        type_k=inst.type_k,
        type_v=inst.type_v,
    )
    if inst.n_threads > 0:
        model.backend.set_threads(inst.n_threads)
    return Context(model, params)


def run_test(ctx: Any, test: Test, rng: np.random.Generator) -> int:
    """Run ``test`` once on an empty cache (``n_depth`` tokens decoded into it first,
    untimed); return the wall time of the test itself in nanoseconds."""
    from tessera.engine.batch import Batch

    n_vocab = ctx.model.n_vocab
    ctx.kv.clear()
    depth = test.n_depth
    if depth:
        _prefill(ctx, rng.integers(0, n_vocab, depth), 0)
    pruned = False
    cache = _expert_cache(ctx.model)
    before = cache.stats() if cache is not None else None
    t0 = time.perf_counter_ns()
    if test.n_prompt:
        pruned = _prefill(ctx, rng.integers(0, n_vocab, test.n_prompt), depth)
    for pos in range(test.n_gen):
        ctx.decode(Batch.for_sequence(rng.integers(0, n_vocab, 1), depth + test.n_prompt + pos))
    elapsed = time.perf_counter_ns() - t0
    ctx.kv.clear()
    test.pruned = test.pruned or pruned
    if cache is not None:
        after, sums = cache.stats(), test.moe_cache or dict.fromkeys(CACHE_COUNTERS, 0)
        test.moe_cache = {k: sums[k] + after[k] - before[k] for k in CACHE_COUNTERS}
    return elapsed


def _prefill(ctx: Any, tokens: np.ndarray, start: int) -> bool:
    """``tokens`` at positions ``start ...`` in ``n_batch`` chunks, logits for the last one
    only; whether a chunk was pruned."""
    from tessera.engine.batch import Batch

    pruned, n_batch = False, ctx.params.n_batch
    for at in range(0, len(tokens), n_batch):
        last = at + n_batch >= len(tokens)
        chunk = tokens[at : at + n_batch]
        ctx.decode(Batch.for_sequence(chunk, start + at, 0, "last" if last else "none"))
        pruned = pruned or bool(getattr(ctx.model.graph, "last_pruned", False))
    return pruned


#: The expert cache's counters a test reports (deltas over its timed runs).
CACHE_COUNTERS = ("hits", "misses", "evictions", "bytes_moved")


def _expert_cache(model: Any) -> Any:
    experts = getattr(model, "experts", None)
    return experts.cache if experts is not None else None


def bench_model(model: Any, args: argparse.Namespace, printer: Printer) -> None:
    """Every test on every instance of ``model``; each test's rows as soon as it is done."""
    sizes = [(p, 0, d) for d in args.n_depth for p in args.n_prompt if p]
    sizes += [(0, n, d) for d in args.n_depth for n in args.n_gen if n]
    n_ctx = max([p + n + d for p, n, d in sizes] + [16])
    rng = np.random.default_rng(args.seed)
    contexts = []
    for inst in instances(args):
        ctx = _context(model, inst, n_ctx)
        if not args.no_warmup and sizes:
            run_test(ctx, Test(inst, min(n_ctx - 1, 32), 1), rng)
        contexts.append((inst, ctx))
    for n_prompt, n_gen, n_depth in sizes:
        runs = [
            (Test(inst, n_prompt, n_gen, kv_path=ctx.kv_path, prune_reason=ctx.prune_reason,
                  n_depth=n_depth), ctx)
            for inst, ctx in contexts
        ]  # fmt: skip
        for rep in range(max(args.repetitions, 1)):
            # Alternate the order per repetition: a drift in machine load hits every instance.
            for test, ctx in runs if rep % 2 == 0 else runs[::-1]:
                if test.instance.n_threads > 0:
                    model.backend.set_threads(test.instance.n_threads)
                test.samples_ns.append(run_test(ctx, test, rng))
        for test, _ctx in runs:
            printer.row(test_record(model, test))


def _models(args: argparse.Namespace, runtime: Any) -> Any:
    """Yield the models to bench one at a time (a shape model is freed before the next)."""
    from tessera.cli.args import moe_options_from_args
    from tessera.files.load import load_model
    from tessera.testing.shapes import random_model

    if args.model and args.shape:
        raise TesseraError("give either -m or --shape, not both")
    moe = moe_options_from_args(args)
    if args.shape and moe != type(moe)():
        raise TesseraError("--cpu-moe, -ncmoe and --moe-cache-mib need -m with an MoE model")
    if args.shape:
        for name in args.shape:
            yield random_model(runtime, name, args.backend, args.shape_vocab,
                               device=args.device, dtype=args.dtype, progress=True)  # fmt: skip
            gc.collect()
        return
    from tessera.files.load import default_model_path

    yield load_model(args.model or default_model_path(), runtime, args.backend, progress=True,
                     device=args.device, dtype=args.dtype, moe=moe)  # fmt: skip


def run(args: argparse.Namespace, runtime: Any) -> int:
    if args.repetitions < 1:
        raise TesseraError("-r must be at least 1")
    printer = Printer(args.output)
    for model in _models(args, runtime):
        bench_model(model, args, printer)
        del model  # let the next shape model replace this one, not sit beside it
    printer.close()
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command("bench", "prompt and generation tokens/s (like llama-bench)", add_arguments, run)
    )
