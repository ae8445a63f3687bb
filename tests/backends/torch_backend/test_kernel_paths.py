"""Each CPU kernel family's path on the torch backend (``Backend.paths``, as ``tessera
plugins`` lists them): the CPU line, the quantized decode GEMV (overall and per type), the
prefill tiles, the dense GEMV, the decode attention and the KV types; and
``TESSERA_NATIVE_PATH`` forcing a path: the reported path changes, the reason names the
switch, and the matmuls run that path (checked against numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.native import cpu_paths, library
from tessera.cli.main import main
from tessera.files.gguf import RawTensor
from tessera.plugin_manager import Runtime
from tessera.plugins.quant.native_weight import NativeBlockWeight

RUNTIME = Runtime()
FAMILIES = ("CPU", "quant decode GEMV", "prefill tiles", "dense F16/BF16 GEMV")
FAMILIES += ("decode attention", "KV types", "quant decode GEMV Q4_0", "quant decode GEMV Q8_0")


@pytest.fixture
def fresh_backend():
    """A new CPU bf16 backend per call (its own probes), its native kernels required."""

    def make():
        b = RUNTIME.create_backend("torch", device="cpu", dtype="bf16")
        RUNTIME.equip(b)
        if b._native() is None and library.cpu_supported(library.cpu_flags()):
            pytest.fail(f"no native kernels on a CPU with AVX2: {b.paths['native kernels']}")
        return b

    if not library.cpu_supported(library.cpu_flags()):
        # Real skip: the kernels need AVX2/FMA/F16C; the project's machines have them.
        pytest.skip("the CPU lacks AVX2, FMA or F16C")
    return make


def q4_k_weight(b, kind="Q4_K", n_out=24, n_in=512):
    qt = RUNTIME.quant_type_by_name(kind)
    values = np.random.default_rng(2).standard_normal((n_out, n_in)).astype(np.float32)
    raw = qt.quantize_tensor(values).reshape(n_out, -1)
    tensor = RawTensor("blk.0.ffn_up.weight", qt.ggml_type, (n_out, n_in), raw.reshape(-1))
    return b.load_weight(tensor, qt), qt.dequantize(raw).astype(np.float64)


def test_every_family_has_a_line_with_the_cpu_and_its_widest_path(fresh_backend, monkeypatch):
    monkeypatch.delenv(cpu_paths.NATIVE_PATH.name, raising=False)
    b = fresh_backend()
    gemv = b._native()
    assert all(family in b.paths for family in FAMILIES)
    assert b.paths["CPU"].path == cpu_paths.cpu_model()
    assert b.paths["CPU"].reason.startswith("AVX2 FMA F16C")
    widest = cpu_paths.quant_path(gemv.isa, False)
    flags = library.cpu_flags()
    want = "avx512-vnni" if {"avx512_vnni", "avx512bw", "avx512vl"} <= flags else "avx2"
    want = "avx-vnni" if want == "avx2" and "avx_vnni" in flags else want
    assert b.paths["quant decode GEMV"].path == widest == want
    assert "-march=native" in b.paths["quant decode GEMV"].reason
    assert b.paths["decode attention"].path == ("avx512f" if "avx512f" in flags else "avx2")
    assert b.paths["KV types"].path == "f32, bf16, f16, q8_0"
    assert b.paths["prefill tiles"].path == (
        "amx-bf16" if gemv.amx else "dequantize + torch matmul"
    )


def test_native_disable_sends_every_family_to_its_fallback(fresh_backend, monkeypatch):
    monkeypatch.setenv("TESSERA_NATIVE_DISABLE", "1")
    b = RUNTIME.create_backend("torch", device="cpu", dtype="bf16")
    RUNTIME.equip(b)
    assert b._native() is None
    assert b.paths["quant decode GEMV"].path == cpu_paths.FALLBACK
    assert b.paths["decode attention"].path == "SDPA"
    assert "TESSERA_NATIVE_DISABLE=1" in b.paths["dense F16/BF16 GEMV"].reason


@pytest.mark.parametrize("forced", ["avx512-vnni", "avx-vnni", "avx2"])
def test_a_forced_vector_path_is_reported_with_the_switch(fresh_backend, monkeypatch, forced):
    """The library is built without the wider instructions; a path the CPU lacks is
    refused by name and the widest one taken."""
    monkeypatch.setenv(cpu_paths.NATIVE_PATH.name, forced)
    b = fresh_backend()
    choice = b.paths["quant decode GEMV"]
    missing = [f for f in cpu_paths.PATH_CPU_FLAGS[forced] if f not in library.cpu_flags()]
    if missing:
        assert f"TESSERA_NATIVE_PATH={forced} refused: the CPU lacks" in choice.reason
    else:
        assert choice.path == forced
        assert f"forced by TESSERA_NATIVE_PATH={forced}" in choice.reason
    w, dense = q4_k_weight(b)
    assert isinstance(w, NativeBlockWeight)
    assert b.paths["quant decode GEMV Q4_K"].path == choice.path
    if forced == "avx2" and not missing:
        assert b.paths["decode attention"].path == "avx2"
        assert b.paths["dense F16/BF16 GEMV"].path == "avx2"
    x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    want = x @ dense.T
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


def test_portable_path_runs_the_plain_c_gemv(fresh_backend, monkeypatch):
    monkeypatch.setenv(cpu_paths.NATIVE_PATH.name, "portable")
    b = fresh_backend()
    gemv = b._native()
    assert gemv.portable
    assert b.paths["quant decode GEMV"].path == "portable"
    assert "forced by TESSERA_NATIVE_PATH=portable" in b.paths["quant decode GEMV"].reason
    assert b.paths["quant decode GEMV Q4_0"].path == "portable"
    calls = []
    original = type(gemv).gemv_portable
    monkeypatch.setattr(
        type(gemv), "gemv_portable", lambda s, *a, **k: calls.append(a[0]) or original(s, *a, **k)
    )
    w, dense = q4_k_weight(b)
    assert b.paths["quant decode GEMV Q4_K"].path == "portable"
    x = np.random.default_rng(4).standard_normal((1, 512)).astype(np.float32)
    got = b.to_numpy(b.matmul(b.from_numpy(x), w))
    want = x @ dense.T
    assert calls == ["Q4_K"] and np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    q, _ = q4_k_weight(b, "IQ4_XS", n_in=256)  # no portable kernel: the plugin's torch path
    assert not isinstance(q, NativeBlockWeight)
    assert b.paths["quant decode GEMV IQ4_XS"].path == cpu_paths.FALLBACK
    assert "TESSERA_NATIVE_PATH=portable" in b.paths["quant decode GEMV IQ4_XS"].reason


def test_plugins_lists_the_families_and_a_forced_path(fresh_backend, monkeypatch, capsys):
    monkeypatch.setenv(cpu_paths.NATIVE_PATH.name, "portable")
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert f"    CPU: {cpu_paths.cpu_model()} (AVX2 FMA F16C" in out
    line = "    quant decode GEMV: portable (forced by TESSERA_NATIVE_PATH=portable; self-test"
    assert line in out
    for family in ("prefill tiles", "dense F16/BF16 GEMV", "decode attention", "KV types"):
        assert f"    {family}: " in out
    assert "decoder block: op by op (TESSERA_NATIVE_PATH=portable" in out


def test_a_path_the_switch_does_not_take_is_one_error_line(capsys, monkeypatch):
    monkeypatch.setenv(cpu_paths.NATIVE_PATH.name, "sse")
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: TESSERA_NATIVE_PATH='sse' is not a value this switch")
    assert "auto, avx512-vnni, avx-vnni, avx2, portable" in err[-1]


def test_cpuinfo_fields_are_the_first_cpus(tmp_path):
    """The CPU line's facts come from the first processor's block of /proc/cpuinfo."""
    info = tmp_path / "cpuinfo"
    block = "processor\t: {0}\nvendor_id\t: {1}\nmodel name\t: {2}\nflags\t\t: {3}\n\n"
    info.write_text(
        block.format(0, "AuthenticAMD", "AMD EPYC 9R14", "fpu avx2 avx512_bf16")
        + block.format(1, "GenuineIntel", "other", "fpu")
    )
    assert cpu_paths.cpu_vendor(info) == "AuthenticAMD"
    assert cpu_paths.cpu_model(info) == "AMD EPYC 9R14"
    assert library.cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    missing = tmp_path / "none"
    assert (cpu_paths.cpu_vendor(missing), cpu_paths.cpu_model(missing)) == ("", "unknown CPU")
    assert library.cpu_flags(missing) == set()
