"""The cyclic collector is held off while a model loads and restored after it."""

from __future__ import annotations

import gc

import pytest

from tessera.backends.numpy import NumpyBackend
from tessera.files.gc_pause import collector_paused
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_the_collector_is_off_inside_and_on_again_after(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_after_an_error(collector_on):
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("bad file")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


class _WatchingBackend(NumpyBackend):
    """Records whether the collector ran while each weight was loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.collector_states: set[bool] = set()

    def load_weight(self, raw, qtype):
        self.collector_states.add(gc.isenabled())
        return super().load_weight(raw, qtype)


def test_weights_load_with_the_collector_paused(collector_on, tmp_path):
    backend = _WatchingBackend()
    load_model(make_gguf(tmp_path / "m.gguf", "llama"), Runtime(), backend)
    assert backend.collector_states == {False}
    assert gc.isenabled()
