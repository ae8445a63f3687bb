#!/usr/bin/env python3
"""Train tessera's tiny mixture-of-experts model (``qwen3moe``, 8 experts, top-2) on CPU.

Same data and tokenizer as the default model (``training/train_default_model.py``): the
corpus written by ``training/build_corpus.py`` and the bundled default model's BPE
vocabulary, read back from ``core/default_model/tessera-default.gguf`` so both models
tokenize alike. The model is a ``Qwen3MoeForCausalLM`` trained with the router's
load-balancing loss, so its routing has the temporal locality a trained MoE has (random
routers have none) — what the expert cache benchmark needs.

Examples::

    python training/train_moe_model.py --minutes 13          # -> training/out_moe/hf
    python training/train_moe_model.py --steps 514           # the shipped model's schedule
    tessera convert training/out_moe/hf core/default_model/tessera-moe.gguf --outtype q8_0 \
        --name tessera-moe

The default shape (hidden 256, expert FFN 512: experts are 87% of the parameters) makes
expert weights dominate a token's work, as in real MoE models, so an offloaded expert's
miss costs about as much as the rest of a decode step. ``--hidden 128 --expert-ff 256``
gives the previous, smaller model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from train_default_model import (  # noqa: E402  (a sibling script, not a package)
    CHATML_TEMPLATE,
    EOT,
    encode_docs,
    evaluate,
    get_batch,
    load_documents,
    lr_at,
    split_documents,
)

DEFAULT_GGUF = HERE.parent / "core" / "default_model" / "tessera-default.gguf"


def default_tokenizer():
    """The bundled default model's tokenizer as an HF ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer

    from tessera.files.gguf import read_gguf
    from tessera.testing.models import tokenizer_json_from_gguf

    metadata = read_gguf(DEFAULT_GGUF).metadata
    return Tokenizer.from_str(tokenizer_json_from_gguf(metadata))


def make_config(args, vocab_size: int, eos_id: int):
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.expert_ff * 2,  # unused: every layer is sparse
        moe_intermediate_size=args.expert_ff,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        num_experts=args.experts,
        num_experts_per_tok=args.experts_used,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        output_router_logits=True,
        router_aux_loss_coef=args.aux_loss,
        max_position_embeddings=args.max_pos,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg


def moe_loss(model, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Language-model loss plus the router's load-balancing loss (as HF computes it)."""
    out = model(input_ids=batch[:, :-1], use_cache=False)
    logits = out.logits.float()
    lm = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)
    )
    return lm + model.config.router_aux_loss_coef * out.aux_loss, lm


def parse_args():
    ap = argparse.ArgumentParser(description="Train tessera's tiny MoE model (CPU).")
    ap.add_argument("--corpus", type=Path, default=HERE / "out" / "corpus.txt")
    ap.add_argument("--out", type=Path, default=HERE / "out_moe")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--experts-used", type=int, default=2)
    ap.add_argument("--expert-ff", type=int, default=512)
    ap.add_argument("--aux-loss", type=float, default=0.01)
    ap.add_argument("--max-pos", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--val-frac", type=float, default=0.02)
    ap.add_argument("--minutes", type=float, default=8.0, help="budget (ignored with --steps)")
    ap.add_argument("--steps", type=int, default=0, help="fixed number of optimiser steps")
    ap.add_argument("--calib-steps", type=int, default=10)
    ap.add_argument("--log-every", type=int, default=10)
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    docs = load_documents(args.corpus)
    train_docs, val_docs = split_documents(docs, args.val_frac)
    tok = default_tokenizer()
    eos = tok.token_to_id(EOT)
    train_ids, val_ids = encode_docs(tok, train_docs), encode_docs(tok, val_docs)
    print(f"tokens: {len(train_ids):,} train / {len(val_ids):,} val", flush=True)

    from transformers import PreTrainedTokenizerFast, Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM(make_config(args, tok.get_vocab_size(), eos))
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M params", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(args.seed)
    total = args.steps or None
    t0, step, lm = time.time(), 0, torch.tensor(float("nan"))
    recal_at: set[int] = set()
    while total is None or step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total or 10**9, args)
        loss, lm = moe_loss(model, get_batch(train_ids, args.batch, args.seq_len, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if not args.steps and (step == args.calib_steps or step in recal_at):
            # The wall-clock budget becomes a step count, so the cosine schedule completes;
            # re-estimated at every tenth of the run because shared cores change the rate
            # (estimating only early let a 12-minute budget run for 47 minutes).
            per_step = (time.time() - t0) / step
            total = max(step + 1, int(args.minutes * 60 * 0.95 / per_step))
            recal_at = {step + max(1, (total - step) // 10)} if step < 0.9 * total else set()
        if step % args.log_every == 0:
            print(
                f"step {step}/{total} | {(time.time() - t0) / 60:4.1f} min | "
                f"lm loss {lm.item():.3f} | total {loss.item():.3f}",
                flush=True,
            )
    model.eval()
    model.config.output_router_logits = False
    val = evaluate(model, val_ids, args.seq_len, False)
    hf_dir = args.out / "hf"
    model.float().save_pretrained(hf_dir, safe_serialization=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT, pad_token=EOT
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(hf_dir)
    summary = {
        "model": "Qwen3MoeForCausalLM",
        "params": n_params,
        "steps": step,
        "final_lm_loss": round(lm.item(), 4),
        "final_val_loss": round(val, 4),
        "val_perplexity": round(math.exp(val), 2),
        "train_wall_time_s": round(time.time() - t0, 1),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2), flush=True)


if __name__ == "__main__":
    main()
