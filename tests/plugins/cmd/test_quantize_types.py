"""llama-quantize's file type names and numbers, block sizes, fallbacks and never-quantized
tensors, as ``tessera quantize`` reads them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from tessera.errors import TesseraError
from tessera.plugins.cmd.quantize_types import (
    ALIASES,
    BLOCK_SIZE,
    FALLBACK,
    FILE_TYPES,
    allows_quantization,
    file_type,
    fitting_type,
    n_dims,
)

QUANTS = Path(__file__).resolve().parents[2] / "data" / "quants"
MIXES = QUANTS / "mixes"


def test_names_are_case_insensitive_and_the_k_aliases_are_the_m_mixes():
    assert file_type("q4_k_m") is file_type("Q4_K_M") is file_type("q4_k") is FILE_TYPES["Q4_K_M"]
    assert {a: file_type(a).name for a in ALIASES} == {
        "Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M",
    }  # fmt: skip
    assert file_type("fp8_e4m3").number == 200
    with pytest.raises(TesseraError, match="unknown quant type 'q3_z'; choose one of: F32"):
        file_type("q3_z")


@pytest.mark.parametrize("name", ["Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL",
                                  "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4"])  # fmt: skip
def test_file_type_numbers_are_those_llama_quantize_writes(name):
    """``general.file_type`` of llama-quantize's own output (--pure keeps the number)."""
    path = QUANTS / f"llama-quantize-pure-{name}.gguf"
    written = gguf.GGUFReader(path).fields["general.file_type"].contents()
    wanted = {"Q3_K": "Q3_K_M", "Q5_K": "Q5_K_M", "MXFP4": "MXFP4_MOE"}.get(name, name)
    assert FILE_TYPES[wanted].number == written


def test_every_file_type_s_default_type_and_its_fallback_have_a_block_size():
    assert {f.default for f in FILE_TYPES.values()} <= set(BLOCK_SIZE)
    assert set(FALLBACK) | set(FALLBACK.values()) <= set(BLOCK_SIZE)


def test_block_sizes_are_ggml_s():
    for name, size in BLOCK_SIZE.items():
        if name != "FP8_E4M3":  # tessera's own type, not in ggml
            assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]][0] == size, name


def test_rows_that_do_not_fit_fall_back_as_llama_quantize_does():
    assert fitting_type("Q4_K", 256) == "Q4_K"
    assert fitting_type("Q4_K", 896) == "Q5_0"
    assert fitting_type("Q6_K", 896) == "Q8_0"
    assert fitting_type("IQ4_XS", 320) == "IQ4_NL"
    assert fitting_type("Q4_K", 100) == "F16"  # nor does the fallback fit
    assert fitting_type("Q8_0", 100) == "F16"  # a 32-block type has nothing smaller
    with pytest.raises(TesseraError, match="no fallback"):
        fitting_type("NVFP4", 32)


def test_ggml_counts_outer_dimensions_of_one_as_absent():
    assert [n_dims(s) for s in [(896,), (1, 896), (8, 896), (1, 1, 896), (4, 1, 896)]] == [
        1, 1, 2, 1, 3,
    ]  # fmt: skip
    assert not allows_quantization("blk.0.ffn_gate_inp_shexp.weight", (1, 896), "qwen2moe")


@pytest.mark.parametrize(
    "name",
    ["blk.0.attn_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_q.bias",
     "position_embd.weight", "token_types.weight", "blk.0.ssm_conv1d.weight",
     "blk.0.time_mix_w1.weight"],
)  # fmt: skip
def test_tensors_llama_quantize_never_quantizes(name):
    assert not allows_quantization(name, (64, 256), "llama")


def test_the_recorded_models_keep_what_llama_quantize_keeps():
    """Every tensor the records show unchanged under Q4_0 (which changes every other
    tensor) is one allows_quantization refuses, and no other."""
    for path in MIXES.glob("*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        arch = record["metadata"]["general.architecture"]
        for name, shape, stored, q4_0 in zip(
            record["names"],
            record["shapes"],
            record["stored"],
            record["mixes"]["Q4_0"],
            strict=True,
        ):
            kept = q4_0 == stored and stored not in ("Q4_0", "Q6_K", "Q8_0")
            assert allows_quantization(name, tuple(shape), arch) == (not kept), name
