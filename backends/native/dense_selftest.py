"""The dense 16-bit GEMV's self-test (:func:`dense_ok`) and its error bound
(:func:`dense_bound`): the kernel against numpy's float64 product of the same values.

The weights and activations enter the kernel exactly (16-bit values widened to float32), so
only the float32 sums and the one rounding of each output to its dtype differ from float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The relative rounding of one output value in each torch dtype's name.
OUTPUT_STEP = {"float32": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def dense_bound(x: np.ndarray, w: np.ndarray, want: np.ndarray, out_dtype: str) -> np.ndarray:
    """Bound on ``|kernel - x @ w.T|``: float32 sums (``n_in`` additions of at most
    ``2^-24`` of the running magnitude, below ``1e-6 n_in / 64`` of ``|x| @ |w|.T`` for the
    tree-shaped vector sums), a bias's addition and the output's rounding."""
    exact = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    sums = 2.0**-24 * (x.shape[1] / 16 + 16) * exact
    return sums + (OUTPUT_STEP[out_dtype] + 2.0**-23) * np.abs(want) + 1e-30


def dense_ok(native: Any, seed: int = 0) -> bool:
    """F16 and BF16 weights (ragged row groups, columns off the vector width, 1-6 activation
    rows, two weights and a bias in one call) times float32/bfloat16/float16 activations,
    within :func:`dense_bound` of float64 numpy."""
    import torch

    rng = np.random.default_rng(seed)
    for kind, w_dtype in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        for n_out, n_in, rows in ((7, 40, 1), (9, 96, 6), (5, 33, 3)):
            ws = tuple(
                torch.from_numpy(rng.standard_normal((n, n_in)).astype(np.float32)).to(w_dtype)
                for n in (n_out, 4)
            )
            for x_dtype in (torch.float32, torch.bfloat16, torch.float16):
                x = torch.from_numpy(rng.standard_normal((rows, n_in)).astype(np.float32))
                x = x.to(x_dtype)
                bias = torch.from_numpy(rng.standard_normal(4).astype(np.float32)).to(x_dtype)
                got = native.gemv_dense(kind, ws, x, (None, bias)).double().numpy()
                w = np.concatenate([t.double().numpy() for t in ws])
                xs = x.double().numpy()
                want = xs @ w.T
                want[:, n_out:] += bias.double().numpy()
                bound = dense_bound(xs, w, want, str(x_dtype).split(".")[1])
                if got.shape != want.shape or not np.all(np.abs(got - want) <= bound):
                    return False
    return True


def convert_ok(native: Any) -> bool:
    """``f16_to_bf16`` on every float16 bit pattern (a length off the vector widths, so the
    scalar tail runs too): torch's cast bit for bit, and each NaN a NaN of its sign."""
    import torch

    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    values = torch.cat([bits, bits[:13]]).view(torch.float16)
    got, want = native.f16_to_bf16(values), values.to(torch.bfloat16)
    nan = torch.isnan(values)
    same = torch.equal(got.view(torch.int16)[~nan], want.view(torch.int16)[~nan])
    return (
        same
        and bool(torch.isnan(got[nan]).all())
        and torch.equal(torch.signbit(got[nan]), torch.signbit(values[nan]))
    )
