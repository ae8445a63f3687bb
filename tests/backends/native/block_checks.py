"""The fused decoder block against the same kernels op by op, on either activation path."""

from __future__ import annotations

import numpy as np

#: ``TESSERA_TORCH_F32_ACTIVATIONS`` values the block tests run under: bf16 and float32.
ACTIVATIONS = ("0", "1")


def assert_block_equals_ops(fused: np.ndarray, op_by_op: np.ndarray, f32_activations: str) -> None:
    """bf16 activations: bit for bit (the block runs the same kernels in the same order with
    the same roundings). Float32 activations: within 1e-4 of the logits' scale, not bit for
    bit: the block's SwiGLU forms silu from its own e^x (to ~1e-7) where the op path calls
    torch's F.silu, a difference bf16's rounding of every output hid, and that a value on
    a rounding boundary of the int8 activation blocks turns into one step of them (about
    1e-5 of the scale on the block types' model; float32's own rounding is 1e-7)."""
    if f32_activations == "0":
        np.testing.assert_array_equal(fused, op_by_op)
    else:
        assert np.abs(fused - op_by_op).max() <= 1e-4 * np.abs(op_by_op).max()
