"""Catalogue lookups: one ``get`` per kind, one typed error naming what is installed, and
the default backend chosen by priority."""

from __future__ import annotations

import types

import pytest

from tessera.catalogue import KINDS
from tessera.contract.backend import BackendInfo
from tessera.errors import (
    UnknownArchitectureError,
    UnknownBackendError,
    UnknownNameError,
    UnknownQuantTypeError,
    UnknownSpecDecoderError,
)
from tessera.hookspecs import hookimpl
from tessera.plugin_manager import Runtime


def _backend_plugin(*infos: BackendInfo) -> types.ModuleType:
    module = types.ModuleType("tessera_test_backends")
    module.TESSERA_PLUGIN_API = 2

    @hookimpl
    def tessera_register_backends(register):
        for info in infos:
            register(info)

    module.tessera_register_backends = tessera_register_backends
    return module


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    return Runtime()


@pytest.mark.parametrize(
    ("kind", "name", "error", "listed"),
    [
        ("architecture", "gemma9", UnknownArchitectureError, "llama"),
        ("hf_architecture", "gemma9", UnknownArchitectureError, "qwen2"),
        ("backend", "tpu", UnknownBackendError, "numpy"),
        ("spec_decoder", "eagle", UnknownSpecDecoderError, "ngram"),
        ("quant_type_name", "q9_9", UnknownQuantTypeError, "Q8_0"),
    ],
)
def test_get_raises_the_kinds_error_listing_what_is_installed(runtime, kind, name, error, listed):
    with pytest.raises(error) as raised:
        runtime.get(kind, name)
    assert isinstance(raised.value, UnknownNameError)
    assert f"'{name}'" in str(raised.value) and listed in str(raised.value)


def test_get_returns_the_registered_item(runtime):
    assert runtime.get("architecture", "qwen2") is runtime.architectures()["qwen2"]
    assert runtime.get("quant_type_name", "q8_0").name == "Q8_0"


def test_quant_type_error_names_the_ggml_type_and_tensor(runtime):
    # Q8_1 is ggml's dot-product intermediate: no plugin reads it, as no file stores it
    with pytest.raises(UnknownQuantTypeError, match=r"Q8_1 \(GGML type 9\) of tensor 'w'"):
        runtime.quant_type(9, "w")


def test_every_kind_has_a_hook_in_the_hookspecs(runtime):
    for kind in KINDS.values():
        assert hasattr(runtime.pm.hook, kind.hook), kind.hook


def test_default_backend_is_the_highest_priority_that_can_run():
    def refuse(device=None, dtype=None):
        raise UnknownBackendError("not here")

    made = object()
    runtime = Runtime(entry_points=[])
    runtime.add_plugin(
        _backend_plugin(
            BackendInfo("a-slow", lambda device=None, dtype=None: "slow", priority=0),
            BackendInfo("b-fast", refuse, priority=50),
            BackendInfo("c-fine", lambda device=None, dtype=None: made, priority=10),
        ),
        "test-backends",
    )
    assert runtime.backend_preference() == ["b-fast", "c-fine", "a-slow"]
    assert runtime.create_backend() is made


def test_installed_torch_outranks_the_numpy_reference(runtime):
    backends = runtime.backends()
    assert backends["torch"].priority > backends["numpy"].priority
    assert runtime.backend_preference()[0] == "torch"


def test_hf_config_picks_by_class_name_before_model_type():
    class Arch:  # just the names the catalogue keys by
        def __init__(self, name, hf_model_types=(), hf_classes=()):
            self.names, self.hf_model_types, self.hf_classes = (name,), hf_model_types, hf_classes

    encoder = Arch("encoder", hf_model_types=("shared_type",))
    decoder = Arch("decoder", hf_classes=("SharedForCausalLM",))
    module = types.ModuleType("tessera_test_archs")
    module.TESSERA_PLUGIN_API = 2

    @hookimpl
    def tessera_register_architectures(register):
        register(encoder)
        register(decoder)

    module.tessera_register_architectures = tessera_register_architectures
    runtime = Runtime(entry_points=[])
    runtime.add_plugin(module, "test-archs")
    causal = {"model_type": "shared_type", "architectures": ["SharedForCausalLM"]}
    assert runtime.hf_architecture_for(causal) is decoder
    assert runtime.hf_architecture_for({"model_type": "shared_type"}) is encoder
    other = {"model_type": "shared_type", "architectures": ["SharedModel"]}
    assert runtime.hf_architecture_for(other) is encoder
    with pytest.raises(UnknownArchitectureError, match="'other_type'"):
        runtime.hf_architecture_for({"model_type": "other_type", "architectures": ["X"]})
