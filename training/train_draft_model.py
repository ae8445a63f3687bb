#!/usr/bin/env python3
"""Train the draft model that speculative decoding (``--spec-type draft``) pairs with the
bundled default model.

Same corpus, same document split and the same tokenizer as the default model
(``training/train_default_model.py``; the tokenizer is read from its HF folder, so the
vocabularies are identical by construction). The draft is a 1-layer ``LlamaForCausalLM``
of small width, trained by distillation: the loss mixes cross-entropy on the next token
with the KL divergence to the frozen default model's next-token distribution, because
acceptance depends on agreeing with the target, not on being right.

The result is written as an HF folder and converted to
``core/default_model/tessera-default-draft.gguf`` (f16) with ``tessera convert``::

    python training/train_draft_model.py --steps 400
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_default_model import (  # noqa: E402
    autocast_ctx,
    encode_docs,
    get_batch,
    load_documents,
    lr_at,
    split_documents,
)

REPO = HERE.parent
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train the default model's draft model (CPU).")
    ap.add_argument("--corpus", type=Path, default=HERE / "out" / "corpus.txt")
    ap.add_argument("--target", type=Path, default=HERE / "out" / "hf", help="teacher HF folder")
    ap.add_argument("--out", type=Path, default=HERE / "out" / "draft-hf")
    ap.add_argument(
        "--gguf", type=Path, default=REPO / "core" / "default_model" / "tessera-default-draft.gguf"
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--kd-weight", type=float, default=0.7, help="weight of the KL term")
    ap.add_argument("--val-frac", type=float, default=0.02)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    docs = load_documents(args.corpus)
    train_docs, val_docs = split_documents(docs, args.val_frac)
    train_ids, val_ids = encode_docs(tok, train_docs), encode_docs(tok, val_docs)
    teacher = LlamaForCausalLM.from_pretrained(args.target).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    tcfg = teacher.config
    cfg = LlamaConfig(
        vocab_size=tcfg.vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        hidden_act="silu",
        max_position_embeddings=tcfg.max_position_embeddings,
        rms_norm_eps=tcfg.rms_norm_eps,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tcfg.bos_token_id,
        eos_token_id=tcfg.eos_token_id,
        pad_token_id=tcfg.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"draft: {n_params:,} params; train tokens {len(train_ids):,}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args)
        batch = get_batch(train_ids, args.batch, args.seq_len, gen)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad(), autocast_ctx(True):
            t_logits = teacher(input_ids=x, use_cache=False).logits.float()
        with autocast_ctx(True):
            logits = model(input_ids=x, use_cache=False).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        kd = F.kl_div(
            F.log_softmax(logits, -1),
            F.log_softmax(t_logits, -1),
            log_target=True,
            reduction="batchmean",
        ) / x.size(1)
        loss = (1 - args.kd_weight) * ce + args.kd_weight * kd
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            agree = (logits.argmax(-1) == t_logits.argmax(-1)).float().mean().item()
            print(
                f"step {step}/{args.steps} | {time.time() - t0:6.1f}s | ce {ce.item():.3f} | "
                f"kd {kd.item():.3f} | top-1 agreement with target {agree:.3f}",
                flush=True,
            )
    model.eval()
    with torch.no_grad():
        chunk = val_ids[: (len(val_ids) - 1) // args.seq_len * args.seq_len + 1]
        xs = chunk[:-1].reshape(-1, args.seq_len)
        agree = model(input_ids=xs).logits.argmax(-1) == teacher(input_ids=xs).logits.argmax(-1)
        val_agree = agree.float().mean().item()
    print(f"validation top-1 agreement with the default model: {val_agree:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (args.target / name).exists():
            shutil.copy(args.target / name, args.out / name)
    summary = {
        "params": n_params,
        "steps": args.steps,
        "train_s": round(time.time() - t0, 1),
        "val_top1_agreement": round(val_agree, 4),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    tessera = REPO / ".venv" / "bin" / "tessera"
    subprocess.run(
        [
            str(tessera),
            "convert",
            str(args.out),
            str(args.gguf),
            "--outtype",
            "f16",
            "--name",
            "tessera-default-draft",
        ],
        check=True,
    )
    print(f"wrote {args.gguf} ({args.gguf.stat().st_size / 2**20:.2f} MiB)", flush=True)


if __name__ == "__main__":
    main()
