"""Expert cache benchmark: tg128 and pp512 with every expert offloaded, cache off / on.

    .venv/bin/python bench/moe_cache.py                          # the bundled trained MoE
    .venv/bin/python bench/moe_cache.py --model scaled           # Qwen3-30B-A3B shape, scaled
    .venv/bin/python bench/moe_cache.py --model path/to/moe.gguf --budgets 0,0.25,0.5,1
    .venv/bin/python bench/moe_cache.py --type q4_k     # requantized first (tessera quantize)

Configurations, measured side by side in interleaved rounds (``--repeat``; the cores may
be shared, so compare ratios within one run). tg t/s is 128 over the sum of each decode
step's best time across the rounds (each round repeats the same steps from the same cold
cache, so load from other processes must hit a step in every round to count); pp t/s is
the best round.

- ``resident``: every expert loaded once (no ``--cpu-moe``), the default;
- ``resident, no cache plugin``: the same with the ``moe-cache`` plugin disabled — the
  "everything fits, cache off" case must not be slower than without the feature;
- ``cpu-moe, cache off``: experts stay in the slow tier (the mmapped GGUF) and are
  converted to the backend's form at every use;
- ``cpu-moe, cache X%``: ``--moe-cache-mib`` set to X% of all offloaded experts' bytes.

tg128: 128 decode steps of one token each after a 32-token prompt, the tokens being the
next 128 of a Python documentation text (real text, so a trained router shows its
token-to-token locality; a random model's greedy output would repeat one token); pp512:
one 512-token prompt of the same text. Each run starts with an empty cache (the tg prompt
then fills it, untimed). Hit rates are the cache's counters over the timed part of the
last round.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from tessera.contract.experts import MoEOptions
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf

TRAINED = Path(__file__).resolve().parent.parent / "core" / "default_model" / "tessera-moe.gguf"
#: Qwen3-30B-A3B keeps 128 experts, top-8; width, expert size and depth are scaled down
#: (2048 -> 256 hidden, 768 -> 96 expert FFN, 48 -> 4 layers) to fit a small machine.
SCALED = {
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 4,
    "n_head_kv": 1,
    "head_dim": 64,
    "n_expert": 128,
    "n_expert_used": 8,
    "n_ff_exp": 96,
}


def prompt_tokens(model, n: int) -> list[int]:
    """``n`` tokens of Python documentation (the training corpus's domain)."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))
    ids = model.tokenizer.encode(text[: n * 8]) if model.tokenizer else []
    if len(ids) < n:
        ids = list(np.random.default_rng(0).integers(0, model.n_vocab, n))
    return [int(t) for t in ids[:n]]


def cold(model) -> None:
    """Empty the cache: every timed run starts cold, so a run never profits from the
    experts an earlier run of the same text left behind."""
    if model.experts and model.experts.cache is not None:
        model.experts.cache.clear()


def counters(model) -> tuple[int, int]:
    cache = model.experts.cache if model.experts else None
    if cache is None:
        return 0, 0
    s = cache.stats()
    return s["hits"], s["misses"]


def run_tg(model, prompt: list[int], text: list[int]) -> tuple[np.ndarray, tuple[int, int]]:
    """Decode ``text`` one token per step after ``prompt``: the work of generating it, with
    the routing of natural text (a random-weight model's own greedy output collapses into
    one repeated token, whose routing never changes). Returns each step's seconds: every
    run does the same steps from the same cold cache, so step ``i`` is the same work in
    every round."""
    ctx = Context(model, ContextParams(n_ctx=len(prompt) + len(text) + 1))
    cold(model)
    ctx.decode(Batch.for_sequence(prompt))
    before = counters(model)
    steps = np.empty(len(text))
    for i, token in enumerate(text):
        start = time.perf_counter()
        ctx.decode(Batch.for_sequence([token], start_pos=len(prompt) + i))
        steps[i] = time.perf_counter() - start
    after = counters(model)
    return steps, (after[0] - before[0], after[1] - before[1])


def run_pp(model, prompt: list[int]) -> tuple[float, tuple[int, int]]:
    ctx = Context(model, ContextParams(n_ctx=len(prompt), n_ubatch=len(prompt)))
    cold(model)
    before = counters(model)
    start = time.perf_counter()
    ctx.decode(Batch.for_sequence(prompt))
    seconds = time.perf_counter() - start
    after = counters(model)
    return len(prompt) / seconds, (after[0] - before[0], after[1] - before[1])


def requantized(path: Path, qtype: str) -> Path:
    """``path`` requantized to ``qtype`` by ``tessera quantize`` (llama.cpp's default mix:
    a tensor whose rows do not fill the type's blocks falls back, e.g. Q4_K -> Q8_0), in a
    temporary folder."""
    from tessera.plugins.cmd.quantize import quantize_model

    out = Path(tempfile.mkdtemp()) / f"{path.stem}-{qtype.lower()}.gguf"
    quantize_model(path, out, qtype, Runtime())
    return out


def expert_types(path: Path) -> str:
    """How many of the file's stacked expert tensors are stored in each type, per kind."""
    from gguf import GGMLQuantizationType

    from tessera.files.gguf import read_gguf

    kinds: dict[str, dict[str, int]] = {}
    for name, raw in read_gguf(path).tensors.items():
        kind = name.split(".")[-2]
        if kind.endswith("_exps"):
            qtype = GGMLQuantizationType(raw.ggml_type).name
            kinds.setdefault(kind, {}).setdefault(qtype, 0)
            kinds[kind][qtype] += 1
    return "; ".join(
        f"{kind} " + ", ".join(f"{t} x{n}" for t, n in sorted(types.items()))
        for kind, types in sorted(kinds.items())
    )


def hit_rate(hm: tuple[int, int]) -> str:
    return f"{hm[0] / (hm[0] + hm[1]):.0%}" if hm[0] + hm[1] else "—"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="trained", help="trained, scaled, or a GGUF path")
    ap.add_argument("--slow-type", default="q8_0", help="storage type of the scaled model")
    ap.add_argument(
        "--type",
        default=None,
        help="requantize the model first with `tessera quantize` (q4_k, q6_k, q8_0, q4_0...)",
    )
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budgets", default="0.25,0.5,1", help="cache sizes, fractions of experts")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    if args.model == "trained":
        path = TRAINED
    elif args.model == "scaled":
        tmp = Path(tempfile.mkdtemp())
        path = make_gguf(tmp / "scaled.gguf", "qwen3moe", qtype=args.slow_type, **SCALED)
    else:
        path = Path(args.model)
    if args.type:
        path = requantized(path, args.type)

    def load(runtime, **moe):
        backend = runtime.create_backend(args.backend, dtype=args.dtype)
        backend.set_threads(args.threads)
        return load_model(path, runtime, backend, moe=MoEOptions(**moe))

    runtime, bare = Runtime(), Runtime(disabled=["moe-cache"])
    off = load(runtime, cpu_moe=True)
    expert_bytes = sum(s.n_expert * s.expert_nbytes() for s in off.experts.slow_layers())
    configs = {
        "resident": load(runtime),
        "resident, no cache plugin": load(bare),
        "cpu-moe, cache off": off,
    }
    for frac in (float(f) for f in args.budgets.split(",")):
        mib = frac * expert_bytes / 2**20
        configs[f"cpu-moe, cache {frac:.0%} ({mib:.2f} MiB)"] = load(
            runtime, cpu_moe=True, cache_mib=mib
        )
    model = configs["resident"]
    n_ctx = min(model.n_ctx_train, args.n_prompt)
    pp_prompt = prompt_tokens(model, n_ctx)
    text = prompt_tokens(model, 32 + args.n_gen)
    tg_prompt, tg_text = text[:32], text[32:]
    print(
        f"model {path.name} ({model.config.arch}, {model.config.n_expert} experts, top "
        f"{model.config.n_expert_used}); backend {model.backend.name}/{model.backend.dtype}, "
        f"{args.threads} threads; offloaded expert bytes {expert_bytes / 2**20:.2f} MiB "
        f"(backend form); pp{len(pp_prompt)}, tg{args.n_gen}; {args.repeat} rounds"
    )
    print(f"slow tier storage: {expert_types(path)}")
    best: dict[str, list[float]] = {name: [0.0, 0.0] for name in configs}
    # Per decode step, its fastest time over the rounds: a burst of load from another
    # process then has to hit the same step in every round to show.
    step_best = {name: np.full(len(tg_text), np.inf) for name in configs}
    hits: dict[str, list] = {}
    for m in configs.values():  # warm-up: first-touch costs stay out of the numbers
        run_pp(m, pp_prompt[:64])
    for _ in range(args.repeat):
        for name, m in configs.items():
            steps, tg_hm = run_tg(m, tg_prompt, tg_text)
            pp, pp_hm = run_pp(m, pp_prompt)
            step_best[name] = np.minimum(step_best[name], steps)
            tg = len(tg_text) / step_best[name].sum()
            best[name] = [tg, max(best[name][1], pp)]
            hits[name] = [tg_hm, pp_hm]
    base_tg, base_pp = best["cpu-moe, cache off"]
    res_tg, res_pp = best["resident, no cache plugin"]
    print()
    print(
        "| config | tg t/s | tg vs cache off | tg hit rate | pp t/s | pp vs cache off "
        "| pp hit rate |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (tg, pp) in best.items():
        tg_hm, pp_hm = hits[name]
        print(
            f"| {name} | {tg:.1f} | {tg / base_tg:.2f}x | {hit_rate(tg_hm)} | {pp:.1f} | "
            f"{pp / base_pp:.2f}x | {hit_rate(pp_hm)} |"
        )
    print()
    print(
        f"resident with vs without the cache plugin: tg {best['resident'][0] / res_tg:.3f}x, "
        f"pp {best['resident'][1] / res_pp:.3f}x"
    )
    for name, m in configs.items():
        if m.experts and m.experts.cache is not None:
            print(f"{name}: {m.experts.cache.stats()}")


if __name__ == "__main__":
    main()
