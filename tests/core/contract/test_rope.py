"""RopeArgs rotates as the backend's rope and rope_ext do with the same arguments: plain
rope without factors or a magnitude scale, rope_ext's divisors and mscale otherwise
(the numpy reference backend as the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.rope import RopeArgs

N_ROT, BASE = 8, 10000.0


@pytest.fixture
def x_and_positions():
    rng = np.random.default_rng(0)
    return rng.standard_normal((5, 2, N_ROT)).astype(np.float32), np.arange(3, 8)


@pytest.mark.parametrize("neox", [True, False])
def test_plain_args_are_the_backends_rope(x_and_positions, neox):
    b, (x, pos) = NumpyBackend(), x_and_positions
    args = RopeArgs(N_ROT, BASE, 0.5, neox)
    assert args.plain
    np.testing.assert_array_equal(args.apply(b, x, pos), b.rope(x, pos, N_ROT, BASE, neox, 0.5))


@pytest.mark.parametrize("mscale", [1.0, 1.3])
def test_factors_and_mscale_are_the_backends_rope_ext(x_and_positions, mscale):
    b, (x, pos) = NumpyBackend(), x_and_positions
    divisors = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    args = RopeArgs(N_ROT, BASE, 1.0, True, divisors, mscale)
    assert not args.plain
    want = b.rope_ext(x, pos, N_ROT, BASE, True, 1.0, divisors, mscale=mscale)
    np.testing.assert_array_equal(args.apply(b, x, pos), want)
    # the oracle itself: divisors change the rotation, mscale multiplies it
    assert not np.allclose(want, b.rope(x, pos, N_ROT, BASE, True) * mscale)


def test_a_magnitude_scale_alone_is_not_plain(x_and_positions):
    b, (x, pos) = NumpyBackend(), x_and_positions
    got = RopeArgs(N_ROT, BASE, mscale=2.0).apply(b, x, pos)
    np.testing.assert_allclose(got, 2.0 * b.rope(x, pos, N_ROT, BASE, True), rtol=1e-6)
