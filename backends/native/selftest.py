"""The native kernels' self-test: each kernel of a loaded library against numpy on random
weights, with ``gguf.quants`` as the oracle of the block formats.

Matmuls must stay within the error bound of int8 activations (:func:`error_bound`),
RMSNorm within one rounding of the output dtype, RoPE and the dequantizations bit for bit,
attention within the output dtype's rounding of a float64 reference
(:func:`attention_reference`); :func:`tiles_ok` checks the AMX matmuls. The other block
types (:data:`~tessera.backends.native.typed_gemv.GGML_TYPES`) are checked on random block
bytes (:func:`random_blocks`: every code and scale byte random, the float16 fields finite),
the grid types among them on gguf's dequantization of those bytes.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from tessera.backends.native.kernels import NativeGemv, RowLists
from tessera.backends.native.typed_gemv import GGML_TYPES

#: Byte offsets of the float16 fields (scales, mins) in a block of each type (MXFP4's
#: scale is the E8M0 byte 0, NVFP4's are UE4M3 bytes: every byte is a finite scale; IQ1_M's
#: d is the top nibbles of its four scale words, :data:`IQ1_M_SCALES`).
F16_FIELDS = {
    "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "IQ4_NL": (0,), "IQ4_XS": (0,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "TQ2_0": (64,), "MXFP4": (),
    "Q2_K": (80, 82), "Q3_K": (108,), "TQ1_0": (52,), "NVFP4": (),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ1_M": (),
}  # fmt: skip
#: Where IQ1_M's four uint16 scale words start; nibble k of its float16 d is the top
#: nibble of word k.
IQ1_M_SCALES = 48


def error_bound(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bound on ``|native - x @ w.T|`` from int8 activations: each activation is off by at
    most half a step, ``max|block| / 254``, so a dot product by at most the sum over
    blocks of that times ``sum |w|`` of the block; plus float32 rounding of the sums."""
    xb = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, 32)
    step = xb.max(axis=2) / 254  # (T, nb)
    wb = np.abs(w.astype(np.float64)).reshape(w.shape[0], -1, 32).sum(axis=2)  # (n_out, nb)
    exact = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    return step @ wb.T * (1 + 1e-4) + 1e-5 * exact + 1e-30


@attrs.frozen
class _GgufOracle:
    """Quantize and dequantize one GGML type with ``gguf.quants``, the self-test's oracle
    (the kernels are checked against the format, not against a quant-type plugin)."""

    name: str

    def quantize(self, x: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        return quants.quantize(x, GGMLQuantizationType[self.name])

    def dequantize(self, b: np.ndarray) -> np.ndarray:
        from gguf import GGMLQuantizationType, quants

        return quants.dequantize(b, GGMLQuantizationType[self.name])


def random_blocks(kind: str, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_out, row bytes)`` of random ``kind`` blocks: random bytes, the float16 fields set
    to finite values (N(0, 0.01); MXFP4's E8M0 scales 2^-9 .. 2^4), so every code, group
    scale and bit pattern occurs."""
    from gguf import GGMLQuantizationType, quants

    block, size = quants.GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, (n_out, n_in // block * size), dtype=np.uint8)
    blocks = raw.reshape(n_out, -1, size)
    if kind == "MXFP4":
        blocks[:, :, 0] = rng.integers(118, 132, blocks.shape[:2])
    if kind == "IQ1_M":
        d = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype("<f2").view("<u2")
        words = blocks[:, :, IQ1_M_SCALES : IQ1_M_SCALES + 8].copy().view("<u2")
        for k in range(4):
            words[..., k] = (words[..., k] & 0x0FFF) | ((d >> 4 * k) & 15) << 12
        blocks[:, :, IQ1_M_SCALES : IQ1_M_SCALES + 8] = words.view(np.uint8)
    for at in F16_FIELDS[kind]:
        scales = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype("<f2")
        blocks[:, :, at : at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return raw


def typed_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Every type of ``GGML_TYPES`` on random blocks (ragged row groups, 1-6 activation rows,
    two weights in one call) within the int8 bound of the oracle's product, and its
    dequantization bit for bit (finite values) the oracle's values rounded to each dtype."""
    import torch

    for kind in GGML_TYPES:
        oracle = _GgufOracle(kind)
        for n_out, n_in, rows in ((7, 512, 1), (6, 256, 6), (9, 768, 3)):
            raws = [random_blocks(kind, n, n_in, rng) for n in (n_out, 5)]
            dense = np.concatenate([oracle.dequantize(r) for r in raws]).astype(np.float64)
            x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32)).bfloat16()
            ws = tuple(torch.from_numpy(r) for r in raws)
            got = native.matmul_n(kind, ws, x, (None, None)).float().numpy()
            xs = x.float().numpy()
            want = xs.astype(np.float64) @ dense.T
            bound = error_bound(dense, xs) + 2.0**-8 * np.abs(want)
            if got.shape != want.shape or not np.all(np.abs(got - want) <= bound):
                return False
            for dtype in (torch.float32, torch.bfloat16, torch.float16):
                want_d = torch.from_numpy(dense[:n_out].astype(np.float32)).to(dtype)
                if not torch.equal(native.dequantize(kind, ws[0], dtype), want_d):
                    return False
    return True


def self_test(native: NativeGemv, threads: int = 1) -> bool:
    """Every kernel on random weights (odd row counts, 1-6 activation rows; float32 and
    bfloat16 activations) vs numpy."""
    import torch

    rng = np.random.default_rng(0)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for qmod, name in ((_GgufOracle("Q8_0"), "Q8_0"), (_GgufOracle("Q4_0"), "Q4_0")):
            for n_out, n_in, rows in ((37, 96, 5), (8, 64, 1), (5, 32, 2)):
                w = rng.standard_normal((n_out, n_in)).astype(np.float32)
                raw = torch.from_numpy(qmod.quantize(w))
                dense = qmod.dequantize(raw.numpy())
                for dtype, rounding in ((torch.float32, 0.0), (torch.bfloat16, 2.0**-8)):
                    x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32))
                    x = x.to(dtype)
                    got = native.matmul(name, raw, x).float().numpy()
                    xs = x.float().numpy()
                    want = xs.astype(np.float64) @ dense.astype(np.float64).T
                    bound = error_bound(dense, xs) + rounding * np.abs(want)
                    if got.shape != want.shape or not np.all(np.abs(got - want) <= bound):
                        return False
                if not _matmul_n_ok(native, name, qmod, rng):
                    return False
                if name == "Q8_0":  # RMSNorm: float32 statistics, as the torch path
                    ok = _rms_norm_ok(native, rng) and _rope_ok(native, rng)
                    if not (ok and _attention_ok(native, rng)):
                        return False
                if name == "Q4_0":  # the prefill dequantization: bit for bit
                    for dtype in (torch.float32, torch.bfloat16, torch.float16):
                        want_d = torch.from_numpy(dense).to(dtype)
                        if not torch.equal(native.dequantize(name, raw, dtype), want_d):
                            return False
        if not (typed_ok(native, rng) and q4_0_x4_ok(native, rng)):
            return False
    finally:
        torch.set_num_threads(saved)
    return True


def q4_0_x4_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Q4_0 in the 4-row layout: two weights (one with a bias) in one call, 1 and 5
    activation rows, within the int8 bound of gguf's values; the file's rows back exactly."""
    import torch

    oracle = _GgufOracle("Q4_0")
    raws = [oracle.quantize(rng.standard_normal((n, 96)).astype(np.float32)) for n in (12, 8)]
    packed = tuple(native.repack_q4_0_x4(torch.from_numpy(r)) for r in raws)
    ids = torch.tensor([11, 0, 5, 5])
    if not torch.equal(native.unpack_q4_0_x4(packed[0], ids), torch.from_numpy(raws[0][ids])):
        return False
    dense = np.concatenate([oracle.dequantize(r) for r in raws]).astype(np.float64)
    bias = torch.from_numpy(rng.standard_normal(8).astype(np.float32)).bfloat16()
    for rows in (1, 5):
        x = torch.from_numpy(rng.standard_normal((rows, 96)).astype(np.float32)).bfloat16()
        got = native.matmul_n("Q4_0_x4", packed, x, (None, bias)).float().numpy()
        xs = x.float().numpy()
        want = xs.astype(np.float64) @ dense.T
        want[:, 12:] += bias.float().numpy()
        if not np.all(np.abs(got - want) <= error_bound(dense, xs) + 2.0**-8 * np.abs(want)):
            return False
    return True


def tiles_ok(native: NativeGemv) -> bool:
    """The AMX matmul on random Q8_0 / Q4_0 / F16 weights (a ragged last row block) vs
    numpy: within bf16's rounding of each output and float32 sums of the weights' values
    rounded to bf16."""
    import torch

    rng = np.random.default_rng(1)
    for name in ("Q8_0", "Q4_0", "F16"):
        w = rng.standard_normal((64, 96)).astype(np.float32)
        if name == "F16":
            raw = torch.from_numpy(w.astype(np.float16))
            dense = raw.bfloat16().double().numpy()
        else:
            qmod = _GgufOracle(name)
            raw = torch.from_numpy(qmod.quantize(w))
            dense = torch.from_numpy(qmod.dequantize(raw.numpy())).bfloat16().double().numpy()
        x = torch.from_numpy(rng.standard_normal((35, 96)).astype(np.float32)).bfloat16()
        got = native.matmul_tiles(name, raw, x)
        if got is None:
            return False
        want = x.double().numpy() @ dense.T
        exact = np.abs(x.double().numpy()) @ np.abs(dense).T
        if not np.all(np.abs(got.double().numpy() - want) <= 2.0**-8 * np.abs(want) + 1e-5 * exact):
            return False
    return True


def _matmul_n_ok(native: NativeGemv, name: str, qmod: Any, rng: np.random.Generator) -> bool:
    """Three weights (one with a bias) in one call vs numpy, in bfloat16."""
    import torch

    sizes = (9, 4, 6)
    ws = [rng.standard_normal((n, 64)).astype(np.float32) for n in sizes]
    raws = tuple(torch.from_numpy(qmod.quantize(w)) for w in ws)
    bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).bfloat16()
    x = torch.from_numpy(rng.standard_normal((2, 64)).astype(np.float32)).bfloat16()
    got = native.matmul_n(name, raws, x, (None, bias, None)).float().numpy()
    dense = np.concatenate([qmod.dequantize(r.numpy()) for r in raws]).astype(np.float64)
    xs = x.float().numpy()
    want = xs.astype(np.float64) @ dense.T
    want[:, 9:13] += bias.float().numpy()
    bound = error_bound(dense, xs) + 2.0**-8 * np.abs(want)
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= bound))


def _rms_norm_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native RMSNorm vs torch's (float32 statistics) within one rounding step of the
    output dtype: only the order of the float32 sum of squares differs."""
    import torch
    import torch.nn.functional as F

    steps = ((torch.float32, 1e-6), (torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11))
    for dtype, step in steps:
        x = torch.from_numpy(rng.standard_normal((3, 100)).astype(np.float32)).to(dtype)
        w = torch.from_numpy(rng.random(100).astype(np.float32) + 0.5)
        want = F.rms_norm(x.float(), (100,), w, 1e-6)
        got = native.rms_norm(x, w, 1e-6).float()
        if not torch.all((got - want).abs() <= step * want.abs() + 1e-7):
            return False
    return True


def _rope_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native RoPE vs the torch backend's eager ops, bit for bit (both pair layouts, a part
    of each head left unrotated)."""
    import torch

    from tessera.backends.torch.rope import rotate

    for dtype in (torch.bfloat16, torch.float16):
        x = torch.from_numpy(rng.standard_normal((3, 2, 12)).astype(np.float32)).to(dtype)
        angle = torch.from_numpy(rng.uniform(-4, 4, (3, 1, 4)))
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
        for neox in (True, False):
            want = rotate(x, cos, sin, 8, neox)
            if not torch.equal(native.rope(x, cos, sin, 8, neox), want):
                return False
    return True


def attention_reference(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    rows: np.ndarray,
    q_rows: np.ndarray,
    allowed: np.ndarray | None,
    scale: float,
) -> np.ndarray:
    """What :meth:`NativeGemv.attention_rows` computes, in float64 numpy."""
    t, h, _ = q.shape
    h_kv, dv = v_cache.shape[1:]
    out = np.zeros((t, h, dv))
    for (si, j), qr in np.ndenumerate(q_rows):
        ok = rows[si] >= 0
        if allowed is not None:
            ok &= allowed[si, j]
        if qr < 0 or not ok.any():
            continue
        cells = rows[si][ok]
        for head in range(h):
            g = head // (h // h_kv)
            score = k_cache[cells, g].astype(np.float64) @ q[qr, head].astype(np.float64) * scale
            p = np.exp(score - score.max())
            out[qr, head] = p @ v_cache[cells, g].astype(np.float64) / p.sum()
    return out.reshape(t, h * dv)


def _attention_ok(native: NativeGemv, rng: np.random.Generator) -> bool:
    """Native attention over row lists (padding, a query with no row, GQA, Dv != D, head
    sizes off the vector width) vs float64 numpy within the output dtype's rounding."""
    import torch

    rows = np.array([[0, 3, 5, -1, 7], [1, 2, -1, 4, 6]], dtype=np.int64)
    q_rows = np.array([[2, 0], [1, -1]], dtype=np.int64)
    allowed = rng.random((2, 2, 5)) < 0.7
    allowed[1, 0] = False  # ubatch row 1 reads nothing: zeros
    for dtype, step in ((torch.float32, 1e-5), (torch.bfloat16, 2.0**-8)):
        q = torch.from_numpy(rng.standard_normal((3, 4, 12)).astype(np.float32)).to(dtype)
        k = torch.from_numpy(rng.standard_normal((8, 2, 12)).astype(np.float32)).to(dtype)
        v = torch.from_numpy(rng.standard_normal((8, 2, 9)).astype(np.float32)).to(dtype)
        for mask in (allowed, None):
            got = native.attention_rows(q, k, v, RowLists(rows, q_rows, mask), 0.3)
            got = got.float().numpy()
            qn, kn, vn = (a.float().numpy() for a in (q, k, v))
            want = attention_reference(qn, kn, vn, rows, q_rows, mask, 0.3)
            if not np.all(np.abs(got - want) <= step * np.abs(want) + 1e-5):
                return False
    return True
