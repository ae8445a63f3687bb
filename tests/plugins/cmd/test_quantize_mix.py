"""The per-tensor type choice of ``tessera quantize`` equals llama-quantize's own, recorded in
tests/data/quants/mixes/ for every file type, on dense, MoE, 80-layer and falcon models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.errors import TesseraError
from tessera.plugins.cmd.quantize_mix import choose_types, llama_order, use_more_bits
from tessera.plugins.cmd.quantize_types import FILE_TYPES, file_type

MIXES = Path(__file__).resolve().parents[2] / "data" / "quants" / "mixes"
RECORDS = sorted(MIXES.glob("*.json"))
#: The file types of FILE_TYPES that llama-quantize has (FP8_E4M3 is tessera's own).
LLAMA_FILE_TYPES = [name for name, f in FILE_TYPES.items() if f.number < 200]


def load(path: Path) -> dict:
    record = json.loads(path.read_text(encoding="utf-8"))
    record["tensors"] = [
        (name, tuple(shape), stored)
        for name, shape, stored in zip(
            record["names"], record["shapes"], record["stored"], strict=True
        )
    ]
    return record


def cases():
    for path in RECORDS:
        record = load(path)
        for key in ("mixes", "pure"):
            for ftype in record.get(key, {}):
                yield pytest.param(path, key, ftype, id=f"{path.stem}-{key}-{ftype}")


def test_the_records_cover_every_llama_file_type_and_the_models_asked_for():
    stems = {p.stem for p in RECORDS}
    assert {"tessera-default", "tessera-moe", "qwen2-0.5b-shape", "qwen2moe"} <= stems
    for path in RECORDS:
        assert sorted(load(path)["mixes"]) == sorted(LLAMA_FILE_TYPES), path.name


@pytest.mark.parametrize("path, key, ftype", list(cases()))
def test_each_tensor_gets_the_type_llama_quantize_gives_it(path, key, ftype):
    record = load(path)
    want = dict(zip(record["names"], record[key][ftype], strict=True))
    got = choose_types(record["tensors"], record["metadata"], file_type(ftype), pure=key == "pure")
    wrong = {n: (got.types[n], t) for n, t in want.items() if got.types[n] != t}
    assert not wrong, f"(tessera, llama-quantize): {wrong}"
    assert list(got.types) == record["names"]


@pytest.mark.parametrize("path", RECORDS, ids=[p.stem for p in RECORDS])
def test_the_choice_does_not_depend_on_the_order_of_the_tensors_in_the_file(path):
    """llama.cpp counts attn_v and ffn_down tensors in its own order (by layer, then
    name); a file listing them otherwise gets the same mix."""
    record = load(path)
    shuffled = sorted(record["tensors"], key=lambda t: llama_order(t[0]), reverse=True)
    for ftype in ("Q4_K_M", "Q3_K_M", "Q2_K"):
        got = choose_types(shuffled, record["metadata"], file_type(ftype)).types
        assert [got[n] for n in record["names"]] == record["mixes"][ftype]


def test_the_mixes_differ_where_llama_cpp_rules_differ():
    """The records exercise the rules: the mixes are not all the default type."""
    record = load(MIXES / "qwen2-0.5b-shape.json")
    q4_k_m = dict(zip(record["names"], record["mixes"]["Q4_K_M"], strict=True))
    assert q4_k_m["token_embd.weight"] == "Q8_0"  # tied head, rows of 896: no Q6_K
    assert q4_k_m["blk.0.attn_v.weight"] == "Q8_0"  # Q6_K wanted, 896 falls back to Q8_0
    assert q4_k_m["blk.3.attn_v.weight"] == "Q5_0"  # Q4_K wanted, 896 falls back to Q5_0
    assert q4_k_m["blk.0.attn_norm.weight"] == "F32"


def test_use_more_bits_picks_the_first_and_last_eighth_and_every_third_between():
    assert [use_more_bits(i, 2) for i in range(2)] == [False, True]
    assert [i for i in range(32) if use_more_bits(i, 32)] == [
        0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31,
    ]  # fmt: skip


def test_an_expert_tensor_without_a_layer_in_its_name_is_refused():
    metadata = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 1,
                "qwen3moe.expert_count": 4}  # fmt: skip
    tensors = [("ffn_down_exps.weight", (4, 256, 256), "F16")]
    with pytest.raises(TesseraError, match="names no layer below block_count 1"):
        choose_types(tensors, metadata, file_type("Q4_K_M"))
