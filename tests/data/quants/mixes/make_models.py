"""Writes the random-weight models whose llama-quantize mixes are recorded here (the
models themselves are not kept: the JSON files carry every name, shape and type).

Run: ``python tests/data/quants/mixes/make_models.py OUT_DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

from tessera.testing import make_gguf
from tessera.testing.shapes import SHAPES


def falcon(path: Path) -> None:
    """A falcon-arch file (tessera has no falcon architecture): fused ``attn_qkv`` and
    llama.cpp's falcon-only rules. llama-quantize reads only its metadata and shapes."""
    n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab = 256, 16, 8, 1, 1024, 512
    head_dim = n_embd // n_head
    writer = gguf.GGUFWriter(str(path), "falcon")
    writer.add_block_count(n_layer)
    writer.add_context_length(512)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_eps(1e-5)
    writer.add_file_type(1)
    rng = np.random.default_rng(0)

    def add(name: str, *shape: int) -> None:
        data = rng.standard_normal(shape).astype(np.float32) * 0.02
        writer.add_tensor(name, data if len(shape) == 1 else data.astype(np.float16))

    add("token_embd.weight", n_vocab, n_embd)
    for i in range(n_layer):
        add(f"blk.{i}.attn_norm.weight", n_embd)
        add(f"blk.{i}.attn_norm.bias", n_embd)
        add(f"blk.{i}.attn_qkv.weight", (n_head + 2 * n_head_kv) * head_dim, n_embd)
        add(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        add(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        add(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    add("output_norm.weight", n_embd)
    add("output_norm.bias", n_embd)
    add("output.weight", n_vocab, n_embd)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    out = Path(sys.argv[1])
    arch, fields = SHAPES["qwen2-0.5b"]
    make_gguf(out / "qwen2-0.5b-shape.gguf", arch, qtype="f16", **fields)
    # n_expert 4 (not 8), a shared expert, rows of 896 and 320: the MoE fallbacks
    make_gguf(out / "qwen2moe.gguf", "qwen2moe", qtype="f16", n_embd=896, n_layer=8,
              n_head=14, n_head_kv=2, head_dim=64, n_ff=4864, n_expert=4, n_expert_used=2,
              n_ff_exp=320, n_ff_shexp=512)  # fmt: skip
    # 80 layers with n_head != n_head_kv is llama.cpp's "70B" llama; an untied output head
    make_gguf(out / "llama-80-layers.gguf", "llama", qtype="f16", n_embd=256, n_layer=80,
              n_head=8, n_head_kv=2, n_ff=512, tied_embeddings=False)  # fmt: skip
    falcon(out / "falcon.gguf")


if __name__ == "__main__":
    main()
