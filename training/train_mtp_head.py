#!/usr/bin/env python3
"""Train a multi-token-prediction (MTP, "nextn") head for the bundled default model and
ship it the way llama.cpp stores one: as an extra block after the main ones.

The head follows DeepSeek-V3 / GLM-4.5's nextn layer. For the target's last hidden state
``h_i`` (the residual stream after its last block, before ``output_norm``) and the
embedding of the next token ``t_{i+1}``::

    m   = eh_proj(concat(enorm(embed(t_{i+1})), hnorm(h_i)))      # 2 n_embd -> n_embd
    m'  = decoder_block(m)                                        # attention + SwiGLU
    p   = softmax(output(shared_head_norm(m')))                   # guess of t_{i+2}

The block has the target's own layer shape, and the embedding and output head are the
target's (frozen, not stored again). Loss: cross-entropy on ``t_{i+2}`` mixed with the KL
divergence to the target's own distribution for ``t_{i+2}`` (acceptance is agreement with
the target), plus the same for a second step that feeds ``m'`` back as ``h`` — which is
how ``--spec-type mtp`` drafts more than one token.

Output: ``core/default_model/tessera-default-mtp.gguf`` = the default model's tensors,
unchanged, plus ``blk.{n_layer}.*`` with ``llama.block_count`` raised by one and
``llama.nextn_predict_layers = 1``::

    python training/train_mtp_head.py --steps 500
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

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
DEFAULT_GGUF = REPO / "core" / "default_model" / "tessera-default.gguf"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train an MTP (nextn) head for the default model.")
    ap.add_argument("--corpus", type=Path, default=HERE / "out" / "corpus.txt")
    ap.add_argument("--target", type=Path, default=HERE / "out" / "hf", help="target HF folder")
    ap.add_argument("--target-gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path, default=HERE / "out" / "mtp")
    ap.add_argument(
        "--gguf", type=Path, default=REPO / "core" / "default_model" / "tessera-default-mtp.gguf"
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--kd-weight", type=float, default=0.7)
    ap.add_argument("--step2-weight", type=float, default=0.5)
    ap.add_argument("--val-frac", type=float, default=0.02)
    return ap.parse_args()


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)) * self.weight


def rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """NeoX-style RoPE on (B, H, T, D) at positions 1..T (as in HF, unpermuted weights)."""
    d = x.size(-1)
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    pos = torch.arange(1, x.size(2) + 1, dtype=torch.float32)
    ang = torch.outer(pos, inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class NextN(nn.Module):
    """One nextn block; parameter names follow HF's ``model.layers.N`` for the block."""

    def __init__(self, c) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.c = c
        self.enorm, self.hnorm = RMSNorm(d, c.rms_norm_eps), RMSNorm(d, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.input_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.q_proj = nn.Linear(d, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, c.rms_norm_eps)
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)
        self.shared_head_norm = RMSNorm(d, c.rms_norm_eps)

    def forward(self, emb: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """(B, T, D) embeddings of t_{i+1} and hidden states h_i -> block output m'."""
        c = self.c
        b, t, _ = emb.shape
        x = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(h)], -1))
        a = self.input_layernorm(x)
        q = self.q_proj(a).view(b, t, c.num_attention_heads, -1).transpose(1, 2)
        k = self.k_proj(a).view(b, t, c.num_key_value_heads, -1).transpose(1, 2)
        v = self.v_proj(a).view(b, t, c.num_key_value_heads, -1).transpose(1, 2)
        q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
        rep = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True)
        x = x + self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        f = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(f)) * self.up_proj(f))


def target_pass(teacher, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits and its last block's output (before the final norm)."""
    seen: list[torch.Tensor] = []
    hook = teacher.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        logits = teacher(input_ids=x, use_cache=False).logits.float()
    finally:
        hook.remove()
    return logits, seen[0].float()


def step_loss(head, teacher, logits_t, h, x, y, kd_weight, offset):
    """Loss of the head predicting token i+1+offset from h_i and t_{i+offset}."""
    emb = teacher.model.embed_tokens(x[:, offset:])
    h = h[:, : emb.size(1)]
    out = head(emb, h)
    logits = teacher.lm_head(head.shared_head_norm(out)).float()
    # row i predicts t_{i+1+offset}: y[:, i + offset]; the target's guess is logits_t there
    target = y[:, offset : offset + emb.size(1)]
    teacher_logits = logits_t[:, offset : offset + emb.size(1)]
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
    kd = F.kl_div(
        F.log_softmax(logits, -1),
        F.log_softmax(teacher_logits, -1),
        log_target=True,
        reduction="batchmean",
    ) / logits.size(1)
    agree = (logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean()
    return (1 - kd_weight) * ce + kd_weight * kd, out, agree


def write_gguf_with_head(args, head: NextN, n_layer: int) -> None:
    from tessera.files.gguf import read_gguf
    from tessera.files.gguf_writer import encode_tensor, storage_types, write_gguf
    from tessera.plugin_manager import Runtime

    runtime = Runtime()
    src = read_gguf(args.target_gguf)
    arch_name = src.architecture
    arch = runtime.architecture(arch_name)
    config = arch.config_from_gguf(src.metadata, {n: t.shape for n, t in src.tensors.items()})
    sd = {k: v.detach().float().numpy() for k, v in head.state_dict().items()}
    p = f"model.layers.{n_layer}."
    hf_names = {
        p + "input_layernorm.weight": sd["input_layernorm.weight"],
        p + "self_attn.q_proj.weight": sd["q_proj.weight"],
        p + "self_attn.k_proj.weight": sd["k_proj.weight"],
        p + "self_attn.v_proj.weight": sd["v_proj.weight"],
        p + "self_attn.o_proj.weight": sd["o_proj.weight"],
        p + "post_attention_layernorm.weight": sd["post_attention_layernorm.weight"],
        p + "mlp.gate_proj.weight": sd["gate_proj.weight"],
        p + "mlp.up_proj.weight": sd["up_proj.weight"],
        p + "mlp.down_proj.weight": sd["down_proj.weight"],
    }
    # The block's own tensors take the arch's HF -> GGUF mapping (Q/K row permutation).
    block = dict(arch.tensors_from_hf(config, hf_names, for_gguf=True))
    q = f"blk.{n_layer}.nextn."
    block |= {
        q + "eh_proj.weight": sd["eh_proj.weight"],
        q + "enorm.weight": sd["enorm.weight"],
        q + "hnorm.weight": sd["hnorm.weight"],
        q + "shared_head_norm.weight": sd["shared_head_norm.weight"],
    }
    shapes = {n: tuple(v.shape) for n, v in block.items()}
    types = storage_types(shapes, "F16", runtime.quant_type_by_name)
    new = [encode_tensor(n, v, types[n]) for n, v in block.items()]
    metadata = dict(src.metadata)
    metadata[f"{arch_name}.block_count"] = n_layer + 1
    metadata[f"{arch_name}.nextn_predict_layers"] = 1
    metadata["general.name"] = "tessera-default-mtp"
    write_gguf(args.gguf, metadata, [*src.tensors.values(), *new])
    print(f"wrote {args.gguf} ({args.gguf.stat().st_size / 2**20:.2f} MiB)", flush=True)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    train_docs, val_docs = split_documents(load_documents(args.corpus), args.val_frac)
    train_ids, val_ids = encode_docs(tok, train_docs), encode_docs(tok, val_docs)
    teacher = LlamaForCausalLM.from_pretrained(args.target).eval()
    for prm in teacher.parameters():
        prm.requires_grad_(False)
    c = teacher.config
    if getattr(c, "head_dim", None) is None:
        c.head_dim = c.hidden_size // c.num_attention_heads
    c.rope_theta = float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
    head = NextN(c)
    n_params = sum(prm.numel() for prm in head.parameters())
    print(f"nextn head: {n_params:,} params", flush=True)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args)
        batch = get_batch(train_ids, args.batch, args.seq_len, gen)
        x, y = batch[:, :-1], batch[:, 1:]
        with torch.no_grad(), autocast_ctx(True):
            logits_t, h = target_pass(teacher, x)
        with autocast_ctx(True):
            # step 1: h_i with t_{i+1} -> t_{i+2}
            loss1, out1, agree1 = step_loss(head, teacher, logits_t, h, x, y, args.kd_weight, 1)
            # step 2: the head's own output m'_i stands in for h_{i+1}
            loss2, _, agree2 = step_loss(head, teacher, logits_t, out1, x, y, args.kd_weight, 2)
        loss = loss1 + args.step2_weight * loss2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(
                f"step {step}/{args.steps} | {time.time() - t0:6.1f}s | loss {loss.item():.3f} | "
                f"agreement with target: step 1 {agree1:.3f}, step 2 {agree2:.3f}",
                flush=True,
            )
    head.eval()
    with torch.no_grad():
        n = (len(val_ids) - 1) // (args.seq_len + 1)
        vb = val_ids[: n * (args.seq_len + 1)].reshape(n, -1)
        logits_t, h = target_pass(teacher, vb[:, :-1])
        _, _, val1 = step_loss(head, teacher, logits_t, h, vb[:, :-1], vb[:, 1:], 0.0, 1)
    print(f"validation step-1 top-1 agreement with the default model: {val1:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "params": n_params,
        "steps": args.steps,
        "train_s": round(time.time() - t0, 1),
        "val_step1_top1_agreement": round(float(val1), 4),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_gguf_with_head(args, head, c.num_hidden_layers)


if __name__ == "__main__":
    main()
