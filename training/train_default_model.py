#!/usr/bin/env python3
"""Train tessera's small embedded default model on CPU.

Pipeline (all offline):

1. read the corpus written by ``training/build_corpus.py``
   (documents separated by ``<|endoftext|>``);
2. train a GPT-2-style byte-level BPE tokenizer with HF ``tokenizers``;
3. train a tiny ``LlamaForCausalLM`` (GQA, RoPE, SwiGLU, tied embeddings)
   with AdamW + warmup/cosine LR for a wall-clock budget or a step count;
4. save a standard HF folder (float32 safetensors + tokenizer.json +
   tokenizer_config.json with a ChatML chat template), a loss log, a
   summary and a few sample continuations.

The wall-clock budget is turned into a step count after timing the first
``--calib-steps`` steps (re-estimated at ~25% and ~50% of the run, since the
cores may be shared), so the cosine schedule always completes.  That makes a
budgeted run depend on machine speed; pass ``--steps N`` for a run whose
schedule, data order and initialisation are fixed by ``--seed`` alone.

Examples::

    python training/build_corpus.py
    python training/train_default_model.py --minutes 25
    python training/train_default_model.py --steps 736           # fixed schedule
    python training/train_default_model.py --samples-only        # regenerate samples.txt
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
EOT = "<|endoftext|>"
SPECIAL_TOKENS = [EOT, "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SAMPLE_PROMPTS = ["The for statement", "A list comprehension", "def "]


# --------------------------------------------------------------------------- #
# data / tokenizer
# --------------------------------------------------------------------------- #


def load_documents(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    docs = [d.strip() for d in text.split(EOT)]
    return [d for d in docs if d]


def split_documents(docs: list[str], val_frac: float):
    """Deterministic split: every k-th document goes to validation."""
    k = max(2, round(1 / val_frac))
    train = [d for i, d in enumerate(docs) if i % k != k // 2]
    val = [d for i, d in enumerate(docs) if i % k == k // 2]
    return train, val


def train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def encode_docs(tok, docs: list[str]) -> torch.Tensor:
    eos = tok.token_to_id(EOT)
    ids: list[int] = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


# --------------------------------------------------------------------------- #
# model
# --------------------------------------------------------------------------- #


def make_config(args, vocab_size: int, bos_id: int, eos_id: int):
    from transformers import LlamaConfig

    kw = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        hidden_act="silu",
        max_position_embeddings=args.max_pos,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attention_bias=False,
        mlp_bias=False,
        use_cache=True,
    )
    import inspect

    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": args.rope_theta}
    else:  # transformers 4.x
        kw["rope_theta"] = args.rope_theta
    cfg = LlamaConfig(**kw)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def lr_at(step: int, total: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * t))


def autocast_ctx(use_bf16: bool):
    if use_bf16:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    import contextlib

    return contextlib.nullcontext()


def lm_loss(model, batch: torch.Tensor, use_bf16: bool) -> torch.Tensor:
    x, y = batch[:, :-1], batch[:, 1:]
    with autocast_ctx(use_bf16):
        logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))


@torch.no_grad()
def evaluate(model, val_ids: torch.Tensor, seq_len: int, use_bf16: bool, batch_size: int = 16):
    model.eval()
    n = (len(val_ids) - 1) // seq_len
    chunks = torch.stack([val_ids[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)])
    tot, cnt = 0.0, 0
    for i in range(0, n, batch_size):
        b = chunks[i : i + batch_size]
        loss = lm_loss(model, b, use_bf16)
        n_tok = b.size(0) * (b.size(1) - 1)
        tot += loss.item() * n_tok
        cnt += n_tok
    model.train()
    return tot / cnt


def get_batch(ids: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - seq_len - 1, (batch,), generator=gen)
    return torch.stack([ids[s : s + seq_len + 1] for s in starts.tolist()])


# --------------------------------------------------------------------------- #
# samples
# --------------------------------------------------------------------------- #


def write_samples(hf_dir: Path, out_path: Path, seed: int, max_new_tokens: int = 80) -> str:
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.eval()
    lines = [f"# samples from {hf_dir} (max_new_tokens={max_new_tokens})", ""]
    for mode in ("greedy", "sampled"):
        for i, prompt in enumerate(SAMPLE_PROMPTS):
            torch.manual_seed(seed + i)
            enc = tok(prompt, return_tensors="pt")
            kw = dict(
                max_new_tokens=max_new_tokens,
                pad_token_id=tok.eos_token_id,
                eos_token_id=tok.eos_token_id,
            )
            if mode == "greedy":
                kw.update(do_sample=False)
            else:
                kw.update(do_sample=True, temperature=0.8, top_k=0, top_p=1.0)
            with torch.no_grad():
                out = model.generate(**enc, **kw)
            text = tok.decode(out[0], skip_special_tokens=True)
            desc = "greedy" if mode == "greedy" else f"sampled, temperature 0.8, seed {seed + i}"
            lines += [f"=== {desc} | prompt: {prompt!r}", text, ""]
    body = "\n".join(lines)
    out_path.write_text(body, encoding="utf-8")
    return body


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #


def parse_args():
    ap = argparse.ArgumentParser(description="Train tessera's embedded default model (CPU).")
    ap.add_argument("--corpus", type=Path, default=HERE / "out" / "corpus.txt")
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads; on the 2-vCPU dev box 1 thread is about as fast as 2 "
        "and degrades far less when other processes compete for the cores",
    )
    # tokenizer
    ap.add_argument("--vocab-size", type=int, default=4096)
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    # optimisation
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--val-frac", type=float, default=0.02)
    ap.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: time a few steps in each and keep the faster one",
    )
    # budget
    ap.add_argument(
        "--minutes",
        type=float,
        default=25.0,
        help="wall-clock budget for the training loop (ignored with --steps)",
    )
    ap.add_argument("--steps", type=int, default=0, help="fixed number of optimiser steps")
    ap.add_argument("--calib-steps", type=int, default=20)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument(
        "--samples-only",
        action="store_true",
        help="only regenerate samples.txt from an existing <out>/hf folder",
    )
    return ap.parse_args()


def bench_precision(model, train_ids, args, gen_seed: int) -> tuple[str, dict]:
    """Time forward+backward (no optimiser step) in fp32 and bf16 autocast."""
    gen = torch.Generator().manual_seed(gen_seed)
    batch = get_batch(train_ids, args.batch, args.seq_len, gen)
    times = {}
    for name, use in (("fp32", False), ("bf16", True)):
        ts = []
        for _ in range(4):
            t0 = time.perf_counter()
            loss = lm_loss(model, batch, use)
            loss.backward()
            ts.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
        times[name] = min(ts[1:])
    best = min(times, key=times.get)
    return best, times


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hf_dir = args.out / "hf"
    if args.samples_only:
        print(write_samples(hf_dir, args.out / "samples.txt", args.seed))
        return

    t_start = time.time()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    # ---- data + tokenizer ------------------------------------------------- #
    docs = load_documents(args.corpus)
    train_docs, val_docs = split_documents(docs, args.val_frac)
    t0 = time.time()
    tok = train_tokenizer(train_docs, args.vocab_size)
    vocab = tok.get_vocab_size()
    train_ids = encode_docs(tok, train_docs)
    val_ids = encode_docs(tok, val_docs)
    corpus_bytes = args.corpus.stat().st_size
    print(
        f"docs: {len(train_docs)} train / {len(val_docs)} val; vocab {vocab}; "
        f"tokens: {len(train_ids):,} train / {len(val_ids):,} val "
        f"({corpus_bytes / (len(train_ids) + len(val_ids)):.2f} bytes/token); "
        f"tokenizer {time.time() - t0:.1f}s",
        flush=True,
    )

    # ---- model ------------------------------------------------------------ #
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    bos_id = eos_id = tok.token_to_id(EOT)
    cfg = make_config(args, vocab, bos_id, eos_id)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    print(f"model: {n_params:,} params ({n_params / 1e6:.2f} M)", flush=True)

    if args.precision == "auto":
        prec, ptimes = bench_precision(model, train_ids, args, args.seed + 99)
        print(
            "precision bench (fwd+bwd s/step): "
            + ", ".join(f"{k} {v:.3f}" for k, v in ptimes.items())
            + f" -> {prec}",
            flush=True,
        )
    else:
        prec, ptimes = args.precision, {}
    use_bf16 = prec == "bf16"
    torch.manual_seed(args.seed)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )

    # ---- training loop ---------------------------------------------------- #
    gen = torch.Generator().manual_seed(args.seed)
    budget_s = args.minutes * 60.0
    total_steps = args.steps if args.steps > 0 else None
    tokens_per_step = args.batch * args.seq_len
    log_path = args.out / "train_log.csv"
    log_f = open(log_path, "w", newline="")
    log = csv.writer(log_f)
    log.writerow(
        ["step", "elapsed_s", "lr", "train_loss", "val_loss", "tokens_seen", "tokens_per_s"]
    )

    step = 0
    recal_at: set[int] = set()
    ema = None
    val_loss = float("nan")
    last_train = float("nan")
    eval_time = 0.0
    t_loop = time.time()
    t_window, tok_window = time.time(), 0
    while True:
        if total_steps is not None and step >= total_steps:
            break
        lr = lr_at(step, total_steps or 10**9, args)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = get_batch(train_ids, args.batch, args.seq_len, gen)
        loss = lm_loss(model, batch, use_bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        tok_window += tokens_per_step
        last_train = loss.item()
        ema = last_train if ema is None else 0.95 * ema + 0.05 * last_train

        if args.steps == 0 and (step == args.calib_steps or step in recal_at):
            # Turn the wall-clock budget into a step count from the measured rate.
            # Re-estimated at ~25% and ~50% of the run because the cores are shared
            # and the rate drifts; the final count is recorded in summary.json.
            per_step = (time.time() - t_loop) / step
            # leave room for periodic evaluation (~3%) and noise from shared cores
            new_total = max(step + 1, int(budget_s * 0.95 / per_step))
            if total_steps is None:
                recal_at = {new_total // 4, new_total // 2}
            total_steps = new_total
            print(
                f"calibrated at step {step}: {per_step:.3f} s/step -> total_steps={total_steps} "
                f"(~{total_steps * tokens_per_step / 1e6:.1f} M tokens)",
                flush=True,
            )

        do_eval = (step % args.eval_every == 0) or (total_steps is not None and step == total_steps)
        elapsed = time.time() - t_loop
        if total_steps is not None and args.steps == 0 and elapsed > budget_s * 1.08:
            print(f"hard wall-clock stop at step {step}", flush=True)
            do_eval = True
            total_steps = step
        if do_eval:
            te = time.time()
            val_loss = evaluate(model, val_ids, args.seq_len, use_bf16)
            eval_time += time.time() - te
        if step % args.log_every == 0 or do_eval:
            now = time.time()
            tps = tok_window / max(1e-9, now - t_window)
            t_window, tok_window = now, 0
            log.writerow(
                [
                    step,
                    f"{elapsed:.1f}",
                    f"{lr:.6g}",
                    f"{last_train:.4f}",
                    f"{val_loss:.4f}" if do_eval else "",
                    step * tokens_per_step,
                    f"{tps:.0f}",
                ]
            )
            log_f.flush()
            msg = (
                f"step {step}/{total_steps or '?'} | {elapsed / 60:5.1f} min | lr {lr:.2e} | "
                f"loss {last_train:.3f} (ema {ema:.3f}) | {tps:,.0f} tok/s"
            )
            if do_eval:
                msg += f" | val {val_loss:.3f} (ppl {math.exp(val_loss):.1f})"
            print(msg, flush=True)

    train_time = time.time() - t_loop
    log_f.close()

    # final train loss: mean loss of the model over a fixed sample of training windows
    tgen = torch.Generator().manual_seed(args.seed + 7)
    fixed = torch.cat([get_batch(train_ids, 16, args.seq_len, tgen) for _ in range(4)])
    model.eval()
    with torch.no_grad():
        final_train = sum(
            lm_loss(model, fixed[i : i + 16], use_bf16).item() for i in range(0, len(fixed), 16)
        ) / (len(fixed) // 16)
    # final validation loss in float32 (what the saved checkpoint gives)
    final_val = evaluate(model, val_ids, args.seq_len, False)

    # ---- save ------------------------------------------------------------- #
    hf_dir.mkdir(parents=True, exist_ok=True)
    model = model.float()
    model.config.dtype = "float32"
    model.generation_config.bos_token_id = bos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(hf_dir, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        pad_token=EOT,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=args.max_pos,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(hf_dir)
    # make sure the config on disk carries the chat template and gpt2-style bos handling
    tc_path = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = CHATML_TEMPLATE
    tc["bos_token"] = EOT
    tc["eos_token"] = EOT
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"  # portable across transformers 4.x/5.x
    tc["add_bos_token"] = False
    tc["add_eos_token"] = False
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")

    tokens_seen = step * tokens_per_step
    summary = {
        "model": "LlamaForCausalLM",
        "params": n_params,
        "vocab_size": vocab,
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "intermediate_size": args.intermediate,
        "max_position_embeddings": args.max_pos,
        "rope_theta": args.rope_theta,
        "tie_word_embeddings": True,
        "corpus_bytes": corpus_bytes,
        "train_tokens": len(train_ids),
        "val_tokens": len(val_ids),
        "bytes_per_token": round(corpus_bytes / (len(train_ids) + len(val_ids)), 3),
        "steps": step,
        "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / len(train_ids), 2),
        "final_train_loss": round(final_train, 4),
        "final_train_loss_last_step": round(last_train, 4),
        "final_val_loss": round(final_val, 4),
        "val_perplexity": round(math.exp(final_val), 2),
        "val_bits_per_byte": round(
            final_val * len(val_ids) / math.log(2) / sum(len(d.encode()) + 1 for d in val_docs), 4
        ),
        "train_wall_time_s": round(train_time, 1),
        "eval_time_s": round(eval_time, 1),
        "total_wall_time_s": round(time.time() - t_start, 1),
        "tokens_per_s": round(tokens_seen / train_time, 1),
        "precision": prec,
        "precision_bench_s_per_step": {k: round(v, 4) for k, v in ptimes.items()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
        },
        "hf_dir": str(hf_dir),
    }
    try:
        import tokenizers
        import transformers

        summary["machine"]["transformers"] = transformers.__version__
        summary["machine"]["tokenizers"] = tokenizers.__version__
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                summary["machine"]["cpu"] = line.split(":", 1)[1].strip()
                break
    except Exception:
        pass
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "params",
                    "steps",
                    "tokens_seen",
                    "final_train_loss",
                    "final_val_loss",
                    "val_perplexity",
                    "train_wall_time_s",
                    "tokens_per_s",
                )
            },
            indent=2,
        ),
        flush=True,
    )

    print(write_samples(hf_dir, args.out / "samples.txt", args.seed), flush=True)


if __name__ == "__main__":
    main()
