"""The example plugins pass tessera's conformance kits (tessera's pytest plugin)."""

from __future__ import annotations

import numpy as np

from tessera.testing.pytest_plugin import (
    architecture_conformance,
    backend_conformance,
    quant_type_conformance,
)


def _reference_quantize(x: np.ndarray) -> np.ndarray:
    """EX_I8 written out block by block, the slow and obvious way."""
    out = []
    for block in np.asarray(x, np.float32).reshape(-1, 32):
        d = np.float32(np.abs(block).max() / np.float32(127))
        codes = np.rint(block / d) if d else np.zeros(32)
        out.append(
            np.concatenate(
                [np.array([d], "<f4").view(np.uint8), codes.astype(np.int8).view(np.uint8)]
            )
        )
    return np.concatenate(out).reshape(*x.shape[:-1], -1)


# Every core op against the numpy reference; GQA attention and normal-mode RoPE are
# reported as "not supported" (skipped), which is an outcome, not a failure.
test_example_backend = backend_conformance("example")

# Layout, shapes, zeros, round trip within 1%, GGUF file, bit-exact with the slow version.
test_ex_i8 = quant_type_conformance("EX_I8", max_error=0.01, reference_quantize=_reference_quantize)

# The built-in qwen2 architecture (NeoX RoPE) with as many KV heads as query heads runs on
# the example backend: a model made, loaded and decoded, with a consistent KV cache.
test_qwen2_on_example = architecture_conformance("qwen2", backend="example", n_head_kv=4)


def test_weights_of_the_example_type_stay_int8(tessera_runtime, tessera_make_gguf):
    from tessera.files.load import load_model

    path = tessera_make_gguf("qwen2", qtype="EX_I8", n_head_kv=4)
    model = load_model(path, tessera_runtime, "example")
    paths = {what: how for what, how, _ in model.backend.placements}
    assert paths["blk.0.attn_q.weight"] == "kernel EX_I8"
    assert paths["blk.0.attn_norm.weight"] == "dequantize"
