"""Speculative decoding vs plain decoding, side by side in one process (docs/speculative.md).

Part 1, the bundled default model (from its MTP variant, whose main weights are the same
file's) with its trained draft model and MTP head: greedy generations of ``-n`` tokens for
a fixed set of prompts from the training domain (Python's documentation), for no
speculation and each ``--types``. Configurations alternate per prompt, so load changes on
a shared machine hit all of them. Each row: decode tokens/s (generation only), the ratio
to no speculation, acceptance rate, mean accepted length per verified batch, and whether
the tokens are identical to plain decoding.

Part 2 (``--big``): a random-weight qwen2 model with Qwen2.5-0.5B's sizes (vocabulary: the
default model's) as target with the default-size draft: the cost when almost nothing is
accepted.

    .venv/bin/python bench/speculative.py -n 128 --big --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tessera.contract.spec import SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime

PROMPTS = [
    "The for statement",
    "A list comprehension",
    "The with statement",
    "class pstats.Stats",
    "Return a new",
    "The import system",
    "json.dumps(obj, *, skipkeys=False",
    "Raised when",
]
QWEN25_05B = {
    "n_embd": 896,
    "n_layer": 24,
    "n_head": 14,
    "n_head_kv": 2,
    "n_ff": 4864,
    "head_dim": 64,
}


def run_config(ctx, tok, prompts, n, name, decoder, params):
    """Generate for every prompt with one configuration; per-prompt tokens and stats."""
    results = []
    for text in prompts:
        prompt = tok.encode(text, add_special=True)
        sampler = Sampler(SamplerParams(temperature=0.0))
        stats = GenerationStats()
        tokens = list(generate(ctx, prompt, n, sampler, decoder=decoder, spec=params, stats=stats))
        results.append((tokens, stats))
    return results


def bench(ctx, tok, prompts, n, configs, rounds):
    """Alternate configurations per prompt and round; sum tokens and times per config."""
    totals = {
        name: {"tokens": 0, "t": 0.0, "drafted": 0, "accepted": 0, "verify": 0}
        for name, _, _ in configs
    }
    outputs: dict[tuple[str, int, str], list[int]] = {}
    for r in range(rounds):
        for i, text in enumerate(prompts):
            order = configs if (i + r) % 2 == 0 else configs[::-1]
            for name, decoder, params in order:
                [(tokens, stats)] = run_config(ctx, tok, [text], n, name, decoder, params)
                outputs[(name, r, text)] = tokens
                t = totals[name]
                t["tokens"] += stats.n_generated
                t["t"] += stats.t_generate
                t["drafted"] += stats.n_drafted
                t["accepted"] += stats.n_accepted
                t["verify"] += stats.n_verify
    identical = {
        name: all(outputs[(name, r, x)] == outputs[("none", r, x)] for (_, r, x) in outputs)
        for name, _, _ in configs
    }
    rows = []
    base = totals["none"]["tokens"] / totals["none"]["t"]
    for name, _, _ in configs:
        t = totals[name]
        tps = t["tokens"] / t["t"]
        rows.append(
            {
                "spec_type": name,
                "tokens": t["tokens"],
                "decode_tps": round(tps, 2),
                "ratio": round(tps / base, 3),
                "acceptance_rate": round(t["accepted"] / t["drafted"], 3) if t["drafted"] else None,
                "mean_accepted_length": round(t["accepted"] / t["verify"], 2)
                if t["verify"]
                else None,
                "n_drafted": t["drafted"],
                "n_accepted": t["accepted"],
                "identical_to_plain": identical[name],
            }
        )
    return rows


def print_table(title, rows):
    print(f"\n{title}\n")
    print("| spec type | decode t/s | vs none | acceptance | mean accepted | identical |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        acc = "-" if r["acceptance_rate"] is None else f"{100 * r['acceptance_rate']:.1f}%"
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        print(
            f"| {r['spec_type']} | {r['decode_tps']:.1f} | {r['ratio']:.2f}x | {acc} | {mal} "
            f"| {'yes' if r['identical_to_plain'] else 'NO'} |"
        )
    sys.stdout.flush()


def make_configs(runtime, ctx, types, params):
    configs = [("none", None, None)]
    for name in types:
        configs.append((name, create_decoder(runtime, name, ctx, params), params))
    return configs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=128, help="tokens per generation")
    ap.add_argument("--types", default="draft,mtp,ngram,select")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--draft-max", type=int, default=SpecParams().draft_max)
    ap.add_argument("--draft-p-min", type=float, default=SpecParams().p_min)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--big", action="store_true", help="also the 0.5B-shaped random target")
    ap.add_argument("--big-n", type=int, default=32, help="tokens per generation, part 2")
    ap.add_argument("--big-prompts", type=int, default=2)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/tessera-bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--target", type=Path, default=None, help="default: the shipped MTP variant")
    ap.add_argument("--draft", type=Path, default=None, help="default: the shipped draft")
    args = ap.parse_args()
    runtime = Runtime()
    here = default_model_path().parent
    target = args.target or here / "tessera-default-mtp.gguf"
    draft = args.draft or here / "tessera-default-draft.gguf"
    params = SpecParams(draft_max=args.draft_max, p_min=args.draft_p_min, model_draft=str(draft))
    model = load_model(target, runtime, args.backend, dtype=args.dtype)
    if args.threads:
        model.backend.set_threads(args.threads)
    ctx = Context(model, ContextParams(n_ctx=512))
    types = [t for t in args.types.split(",") if t]
    prompts = PROMPTS[: args.prompts]
    warm = run_config(ctx, model.tokenizer, prompts[:1], 8, "none", None, None)
    del warm
    t0 = time.time()
    rows = bench(
        ctx,
        model.tokenizer,
        prompts,
        args.n,
        make_configs(runtime, ctx, types, params),
        args.rounds,
    )
    title = (
        f"default model ({model.backend.name}/{model.backend.dtype}), greedy, {args.n} tokens x "
        f"{len(prompts)} prompts x {args.rounds} round(s), draft-max {args.draft_max}, "
        f"p-min {args.draft_p_min} ({time.time() - t0:.0f} s)"
    )
    print_table(title, rows)
    report = {"default": {"title": title, "rows": rows}}
    if args.big:
        path = args.cache_dir / "qwen2.5-0.5b-shape-bf16.gguf"
        if not path.exists():
            from tessera.testing.models import make_gguf

            args.cache_dir.mkdir(parents=True, exist_ok=True)
            make_gguf(path, "qwen2", qtype="bf16", seed=0, runtime=runtime, **QWEN25_05B)
        big = load_model(path, runtime, args.backend, dtype=args.dtype)
        if args.threads:
            big.backend.set_threads(args.threads)
        bctx = Context(big, ContextParams(n_ctx=256))
        btypes = [t for t in types if t in ("draft", "ngram", "select")]  # no MTP layers
        t0 = time.time()
        brows = bench(
            bctx,
            model.tokenizer,
            prompts[: args.big_prompts],
            args.big_n,
            make_configs(runtime, bctx, btypes, params),
            args.rounds,
        )
        btitle = (
            f"random 0.5B-shaped qwen2 target + default-size draft ({big.backend.name}/"
            f"{big.backend.dtype}), greedy, {args.big_n} tokens x {args.big_prompts} prompts "
            f"({time.time() - t0:.0f} s)"
        )
        print_table(btitle, brows)
        report["big"] = {"title": btitle, "rows": brows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
