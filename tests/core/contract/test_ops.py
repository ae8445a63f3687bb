"""The typed op a backend's probe gets, and the separate "worth it" answer."""

from __future__ import annotations

import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.contract.experts import moe_ffn_enabled
from tessera.contract.ops import Op, op
from tessera.engine.context import ContextParams, choose_kv_path


def test_an_op_carries_its_name_dtype_and_parameters_read_only():
    described = op("attention_rows", dtype="bf16", n_head=8, n_head_kv=2)
    assert described == Op("attention_rows", {"n_head": 8, "n_head_kv": 2}, "bf16")
    assert described.get("n_head") == 8 and described.get("head_dim", 64) == 64
    with pytest.raises(TypeError):
        described.params["n_head"] = 1  # type: ignore[index]


class CanButWouldRatherNot(NumpyBackend):
    """Runs attention_rows and moe_ffn but prefers the fallbacks (the "worth it" answer)."""

    name = "reluctant"

    def supports(self, op):
        return op.name in ("attention_rows", "moe_ffn") or super().supports(op)

    def worth(self, op):
        self.asked.append(op.name)
        return False


def test_a_backend_that_can_but_prefers_not_gets_the_fallback_path():
    backend = CanButWouldRatherNot()
    backend.asked = []
    path, why = choose_kv_path(None, ContextParams(), backend, {"n_head": 4, "n_head_kv": 2})
    assert (path, why) == ("dense", "backend reluctant prefers the dense mask")
    choice = moe_ffn_enabled(backend, n_expert=8, n_expert_used=2)
    assert not choice.path and "prefers the core ops" in choice.reason
    assert backend.asked == ["attention_rows", "moe_ffn"]  # asked only after supports said yes


def test_the_default_worth_answer_is_yes():
    assert NumpyBackend().worth(op("matmul"))
