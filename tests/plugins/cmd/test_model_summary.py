"""The start-up summary line names what it says: the architecture and name, the parameter
count and tensor types the file holds, the context, the backend, and every path taken with
its reason."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tessera.engine.context import Context, ContextParams
from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.model_summary import model_summary

RUNTIME = Runtime()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_line_names_the_model_its_context_backend_and_paths(backend):
    path = default_model_path()
    model = load_model(path, RUNTIME, backend)
    ctx = Context(model, ContextParams(n_ctx=256))
    line = model_summary(model, ctx)
    assert "\n" not in line
    stored = read_gguf(path)  # the oracle: the file itself
    n_params = sum(int(np.prod(t.shape)) for t in stored.tensors.values())
    types = Counter(RUNTIME.quant_type(t.ggml_type, n).name for n, t in stored.tensors.items())
    arch, name = stored.metadata["general.architecture"], stored.metadata["general.name"]
    assert line.startswith(f"model: {arch} '{name}' | {n_params / 1e6:.2f}M params | ")
    for qtype, count in types.items():
        assert f"{qtype} x{count}" in line
    b = model.backend
    assert f"| n_ctx 256 | {b.name}/{b.dtype} on {b.device} |" in line
    assert f"kv attention: {ctx.kv_path} ({ctx.kv_path_reason})" in line
    assert f"prefill pruning: {'allowed' if ctx.prune_ok else 'off'} ({ctx.prune_reason})" in line
    for what, choice in b.paths.items():  # the backend's switched paths, with their reasons
        assert f"{what}: {choice}" in line
    weight_paths = {(p, r) for w, p, r in b.placements if w in model.weights}
    for path_taken, reason in weight_paths:
        assert f"{path_taken} x" in line and f"({reason})" in line
