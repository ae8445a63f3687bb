"""Writes the F32 sources of the quant test vectors: source-f32.gguf, edge-f32.gguf and
edge-huge-f32.gguf (README.md says how llama-quantize then made the vectors from them).

Run: ``python tests/data/quants/make_sources.py tests/data/kquants/source-f32.gguf OUT_DIR``.
Each source is a one-layer llama-arch model with the metadata of the K-quant source; its
vocabulary is cut to the new number of rows, which llama-quantize never reads.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

#: GGUF key -> the dimension it carries.
SHAPE_KEYS = {
    "llama.embedding_length": "n_embd",
    "llama.feed_forward_length": "n_ff",
    "llama.attention.head_count": "n_head",
    "llama.attention.head_count_kv": "n_head_kv",
    "llama.attention.key_length": "head_dim",
    "llama.attention.value_length": "head_dim",
    "llama.rope.dimension_count": "head_dim",
}
#: Rows of 256 (one K-quant super-block) and of 768 (three) in ffn_down.
MAIN_DIMS = {"n_embd": 256, "n_ff": 768, "n_head": 4, "n_head_kv": 2, "head_dim": 64}
#: As small as a model gets: attn_output and ffn_down have rows of 32 (one small block),
#: so the 256-block types show llama-quantize's fallback even with --pure.
EDGE_DIMS = {"n_embd": 256, "n_ff": 32, "n_head": 1, "n_head_kv": 1, "head_dim": 32}
#: Near FP16's largest value (65504): 1e30 overflows FP16 block scales, and llama-quantize
#: rejects its own output then ("quantized data validation failed").
HUGE = 6e4
#: For MXFP4 only, whose E8M0 scales reach 2**127.
HUGER = 1e30

Rows = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, dims: dict, n_vocab: int):
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:n_vocab]
    kept = set(tokens)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        if key in SHAPE_KEYS:
            value = dims[SHAPE_KEYS[key]]
        elif key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:n_vocab]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value if set(m.split(" ")) | {m.replace(" ", "")} <= kept]
            if not value:  # GGUF has no empty arrays
                continue
        writer.add_key_value(key, value, vtype, sub)


def tensor_shapes(d: dict, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape (rows, row length) of the one-layer llama model."""
    q, kv = d["n_head"] * d["head_dim"], d["n_head_kv"] * d["head_dim"]
    e, f = d["n_embd"], d["n_ff"]
    return {
        "token_embd.weight": (n_vocab, e),
        "blk.0.attn_norm.weight": (e,),
        "blk.0.attn_q.weight": (q, e),
        "blk.0.attn_k.weight": (kv, e),
        "blk.0.attn_v.weight": (kv, e),
        "blk.0.attn_output.weight": (e, q),
        "blk.0.ffn_norm.weight": (e,),
        "blk.0.ffn_gate.weight": (f, e),
        "blk.0.ffn_up.weight": (f, e),
        "blk.0.ffn_down.weight": (e, f),
        "output_norm.weight": (e,),
        "output.weight": (n_vocab, e),
    }


def random_rows(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Gaussian rows of scales from 0.005 to 0.5, a quarter heavy-tailed (Student t, 3
    degrees of freedom), a tenth with one 40x outlier: block scales and minimums vary."""
    rows, n = shape
    scale = np.exp(rng.uniform(np.log(0.005), np.log(0.5), size=(rows, 1)))
    x = rng.standard_normal(shape) * scale
    heavy = rng.random(rows) < 0.25
    x[heavy] = rng.standard_t(3, size=(int(heavy.sum()), n)) * scale[heavy]
    outlier = rng.random(rows) < 0.1
    cols = rng.integers(0, n, size=int(outlier.sum()))
    x[np.flatnonzero(outlier), cols] *= 40.0
    return x


def special_rows(rng: np.random.Generator, n: int, huge: float) -> list[np.ndarray]:
    """One row of each special kind, of length n (a multiple of 32)."""
    blocks = n // 32
    signs = rng.choice([-1.0, 1.0], n)
    # absmax -8 gives Q4_0's scale 1, so x/d + 8.5 lands exactly on an integer
    ties4 = np.tile(np.concatenate([[-8.0], np.arange(31) % 15 - 7.5]), blocks)
    # absmax 127 gives Q8_0's scale 1, so x/d is exactly k + 0.5
    ties8 = np.tile(np.concatenate([[127.0], np.arange(31) * 8 % 254 - 126.5]), blocks)
    single = np.zeros(n)
    at = np.arange(blocks) * 32 + rng.integers(0, 32, blocks)
    single[at] = rng.choice([-1.0, 1.0], blocks) * rng.uniform(0.1, 3, blocks)
    single_in_row = np.zeros(n)
    single_in_row[rng.integers(0, n)] = 0.7
    twin_max = np.tile(np.concatenate([[-1.0, 1.0], rng.uniform(-0.9, 0.9, 30)]), blocks)
    one_outlier = rng.standard_normal(n) * 0.02
    one_outlier[rng.integers(0, n)] = 1000.0
    return [
        np.zeros(n),
        signs * rng.uniform(1, 2, n) * 1e-30,  # tiny
        np.full(n, 1e-30),  # tiny constant
        signs * rng.uniform(1, 2, n) * 1e-40,  # F32 subnormals
        signs * rng.uniform(0.5, 1, n) * huge,
        np.full(n, -huge),
        ties4,
        ties8,
        single,  # one non-zero value per 32-block
        single_in_row,  # one non-zero value in the whole row
        np.full(n, 0.3),
        np.full(n, -0.3),
        signs * 0.25,  # random signs, equal magnitude
        np.where(np.arange(n) % 2 == 0, 0.5, -0.5),  # +a, -a, +a, ...
        twin_max,  # a block's largest magnitude twice, negative first
        -twin_max,  # ... positive first
        one_outlier,
        -np.abs(rng.standard_normal(n)) * 0.1,  # all negative
        np.abs(rng.standard_normal(n)) * 0.1,  # all positive
    ]


def edge_rows(huge: float) -> Rows:
    """Random rows whose first ones are the special rows, then the same reversed within
    each 32-block (where the tensor has the rows)."""

    def make(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        rows, n = shape
        special = special_rows(rng, n, huge)
        special += [r.reshape(-1, 32)[:, ::-1].reshape(-1) for r in special]
        x = random_rows(rng, shape)
        for i, row in enumerate(special[:rows]):
            x[i] = row
        return x

    return make


def write(path: Path, reader: gguf.GGUFReader, dims: dict, n_vocab: int, rows: Rows, seed: int):
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    copy_metadata(reader, writer, dims, n_vocab)
    for name, shape in tensor_shapes(dims, n_vocab).items():
        data = 1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else rows(rng, shape)
        writer.add_tensor(name, data.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    reader = gguf.GGUFReader(sys.argv[1])
    out = Path(sys.argv[2])
    write(out / "source-f32.gguf", reader, MAIN_DIMS, 256, random_rows, seed=20240601)
    write(out / "edge-f32.gguf", reader, EDGE_DIMS, 64, edge_rows(HUGE), seed=20240602)
    write(out / "edge-huge-f32.gguf", reader, EDGE_DIMS, 64, edge_rows(HUGER), seed=20240602)


if __name__ == "__main__":
    main()
