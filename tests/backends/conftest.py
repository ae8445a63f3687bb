"""The loaded native kernels for the backend tests (:func:`native`: the native kernels' own
and the torch backend's that run on them), and a failure where they should exist but do not."""

from __future__ import annotations

import os
import shutil

import pytest

from tessera.backends.native import library
from tessera.backends.native import probe as native_probe
from tessera.plugin_manager import Runtime


@pytest.fixture(scope="module")
def native():
    runtime = Runtime()
    b = runtime.create_backend("torch", device="cpu", dtype="bf16")
    runtime.equip(b)
    gemv = native_probe.probe(b)
    if gemv is None:
        reason = native_probe.status(b).reason
        cc = os.environ.get("CC", "").strip() or "cc"
        if library.cpu_supported(library.cpu_flags()) and shutil.which(cc):
            # the kernels can exist here, so a failed build or self-test is a failure
            pytest.fail(f"native kernels failed on a CPU and compiler that support them: {reason}")
        # Real skip: without AVX2 or a C compiler the kernels cannot exist on this machine
        # (the fallback tests still run); the project's machines have both.
        pytest.skip(f"native kernels unavailable: {reason}")
    return gemv
