"""The GGUF writer: value types as llama.cpp writes them, tensors, general.* keys, atomicity."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.gguf_writer import (
    TypedValue,
    encode_tensor,
    guess_file_type,
    storage_types,
    value_type_of,
    write_gguf,
)
from tessera.plugin_manager import Runtime

V = GGUFValueType


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def f32_tensor(name: str, values: np.ndarray) -> RawTensor:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return RawTensor(name, 0, values.shape, values.view(np.uint8).reshape(-1))


METADATA = {
    "general.architecture": "llama",
    "general.name": "round trip",
    "llama.block_count": 2,
    "llama.rope.freq_base": 10000.0,
    "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "tokenizer.ggml.add_bos_token": False,
    "tokenizer.ggml.tokens": ["a", "b", "<|endoftext|>"],
    "tokenizer.ggml.token_type": [1, 1, 3],
    "tokenizer.ggml.scores": [0.0, -1.5, 2.0],
    "tokenizer.ggml.eos_token_id": np.int64(2),
    "test.negative": -7,
    "test.big": 2**40,
    "test.explicit": TypedValue(5, V.UINT64),
    "test.bools": [True, False],
    "test.empty_string": "",
}


def test_metadata_values_round_trip_with_llama_cpp_types(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", METADATA, [f32_tensor("x", np.ones(4))])
    fields = GGUFReader(path).fields
    expected_types = {
        "general.architecture": [V.STRING],
        "llama.block_count": [V.UINT32],
        "llama.rope.freq_base": [V.FLOAT32],
        "tokenizer.ggml.add_bos_token": [V.BOOL],
        "tokenizer.ggml.tokens": [V.ARRAY, V.STRING],
        "tokenizer.ggml.token_type": [V.ARRAY, V.INT32],
        "tokenizer.ggml.scores": [V.ARRAY, V.FLOAT32],
        "tokenizer.ggml.eos_token_id": [V.UINT32],
        "test.negative": [V.INT32],
        "test.big": [V.UINT64],
        "test.explicit": [V.UINT64],
        "test.bools": [V.ARRAY, V.BOOL],
        "general.file_type": [V.UINT32],
    }
    for key, types in expected_types.items():
        assert fields[key].types == types, key
    read = read_gguf(path).metadata
    for key, value in METADATA.items():
        want = value.value if isinstance(value, TypedValue) else value
        if isinstance(want, float):
            assert read[key] == pytest.approx(want, rel=1e-7), key
        else:
            assert read[key] == want, key
    assert read["general.file_type"] == 0  # ALL_F32
    assert "general.quantization_version" not in read  # no quantized tensor


def test_empty_lists_are_left_out_as_llama_cpp_does(tmp_path):
    meta = {"general.architecture": "llama", "test.empty": []}
    path = write_gguf(tmp_path / "m.gguf", meta, [])
    assert "test.empty" not in read_gguf(path).metadata


def test_unsupported_metadata_value_is_refused_before_any_file_exists(tmp_path):
    with pytest.raises(TypeError, match="cannot store dict"):
        write_gguf(tmp_path / "m.gguf", {"general.architecture": "x", "k": {"a": 1}}, [])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="general.architecture"):
        write_gguf(tmp_path / "m.gguf", {"general.name": "x"}, [])


def test_value_type_of_mixed_int_float_list_is_float32():
    assert value_type_of([1, 2.5]) == (V.ARRAY, V.FLOAT32)
    with pytest.raises(TypeError):
        value_type_of(["a", 1])


def test_tensors_round_trip_in_every_storage_type(tmp_path, runtime):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5, 64)).astype(np.float32)
    tensors = [
        encode_tensor(f"t.{q}", values, runtime.quant_type_by_name(q))
        for q in ("F32", "F16", "BF16", "Q8_0", "Q4_0")
    ]
    tensors.append(f32_tensor("bias", values[0, 0]))
    path = write_gguf(tmp_path / "t.gguf", {"general.architecture": "llama"}, tensors)
    read = read_gguf(path)
    assert list(read.tensors) == [t.name for t in tensors]
    for t in tensors:
        got = read.tensors[t.name]
        assert (got.ggml_type, got.shape) == (t.ggml_type, t.shape)
        assert np.array_equal(got.data, t.data), t.name
    f32 = runtime.quant_type_by_name("F32")
    assert np.array_equal(f32.dequantize_tensor(read.tensors["t.F32"].data, values.shape), values)
    q8 = runtime.quant_type_by_name("Q8_0")
    decoded = q8.dequantize_tensor(read.tensors["t.Q8_0"].data, values.shape)
    assert np.abs(decoded - values).max() < 0.05
    meta = read.metadata
    assert meta["general.quantization_version"] == 2


def test_tensor_bytes_that_do_not_fit_the_shape_are_refused(tmp_path):
    bad = RawTensor("w", 0, (2, 3), np.zeros(20, dtype=np.uint8))  # F32 (2, 3) needs 24
    with pytest.raises(ValueError, match="'w' has 20 bytes"):
        write_gguf(tmp_path / "m.gguf", {"general.architecture": "llama"}, [bad])
    assert list(tmp_path.iterdir()) == []


def test_file_type_is_the_most_common_2d_type(runtime):
    q8, f32 = runtime.quant_type_by_name("Q8_0"), runtime.quant_type_by_name("F32")
    w = np.zeros((4, 32), dtype=np.float32)
    tensors = [encode_tensor(f"w{i}", w, q8) for i in range(2)]
    tensors += [encode_tensor(f"n{i}", w[0], f32) for i in range(5)]  # 1-D do not count
    assert guess_file_type(tensors) == 7  # LlamaFileType.MOSTLY_Q8_0


def test_custom_alignment_is_written_and_used(tmp_path):
    tensors = [f32_tensor("a", np.ones(3)), f32_tensor("b", np.arange(5))]
    path = write_gguf(tmp_path / "a.gguf", {"general.architecture": "llama"}, tensors, alignment=64)
    reader = GGUFReader(path)
    assert int(reader.fields["general.alignment"].parts[-1][0]) == 64
    assert all(int(t.data_offset) % 64 == 0 for t in reader.tensors)
    assert np.array_equal(np.asarray(reader.tensors[1].data), np.arange(5, dtype=np.float32))


def _fail_on_second_tensor(monkeypatch):
    import gguf

    original = gguf.GGUFWriter.write_tensor_data
    calls = []

    def write_tensor_data(self, tensor, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return original(self, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", write_tensor_data)


def test_failure_mid_write_leaves_no_file(tmp_path, monkeypatch):
    _fail_on_second_tensor(monkeypatch)
    tensors = [f32_tensor("a", np.ones(8)), f32_tensor("b", np.ones(8))]
    with pytest.raises(OSError, match="disk full"):
        write_gguf(tmp_path / "out.gguf", {"general.architecture": "llama"}, tensors)
    assert list(tmp_path.iterdir()) == []


def test_failure_mid_write_keeps_the_existing_file(tmp_path, monkeypatch):
    good = write_gguf(tmp_path / "out.gguf", {"general.architecture": "llama"}, [])
    before = good.read_bytes()
    _fail_on_second_tensor(monkeypatch)
    tensors = [f32_tensor("a", np.ones(8)), f32_tensor("b", np.ones(8))]
    with pytest.raises(OSError):
        write_gguf(good, {"general.architecture": "qwen2"}, tensors)
    assert good.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]


def test_written_file_gets_ordinary_permissions(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    path = write_gguf(tmp_path / "out.gguf", {"general.architecture": "llama"}, [])
    assert path.stat().st_mode == plain.stat().st_mode


def test_rewriting_replaces_the_file(tmp_path):
    path = write_gguf(tmp_path / "out.gguf", {"general.architecture": "llama"}, [])
    write_gguf(path, {"general.architecture": "qwen2"}, [])
    assert read_gguf(path).architecture == "qwen2"


def _types(runtime, shapes, outtype):
    types = storage_types(shapes, outtype, runtime.quant_type_by_name)
    return {name: qtype.name for name, qtype in types.items()}


SHAPES = {
    "token_embd.weight": (100, 64),
    "blk.0.attn_norm.weight": (64,),
    "blk.0.attn_q.weight": (64, 64),
    "blk.0.attn_q.bias": (64,),
    "blk.0.attn_q_norm.weight": (16,),
    "blk.0.ffn_down.weight": (64, 48),  # rows of 48 do not fill 32-value blocks
    "output.weight": (100, 64),
}


@pytest.mark.parametrize("outtype", ["F32", "F16", "BF16", "Q8_0"])
def test_storage_types_follow_convert_hf_to_gguf(runtime, outtype):
    types = _types(runtime, SHAPES, outtype)
    for name in ("blk.0.attn_norm.weight", "blk.0.attn_q.bias", "blk.0.attn_q_norm.weight"):
        assert types[name] == "F32"
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "output.weight"):
        assert types[name] == outtype
    assert types["blk.0.ffn_down.weight"] == ("F16" if outtype == "Q8_0" else outtype)


def test_q4_0_gives_the_output_head_more_bits(runtime):
    has_q6_k = any(q.name == "Q6_K" for q in runtime.quant_types().values())
    head = "Q6_K" if has_q6_k else "Q8_0"
    types = _types(runtime, SHAPES, "Q4_0")
    assert (types["token_embd.weight"], types["output.weight"]) == ("Q4_0", "Q8_0")
    tied = {n: s for n, s in SHAPES.items() if n != "output.weight"}
    tied["token_embd.weight"] = (100, 256)
    assert _types(runtime, tied, "Q4_0")["token_embd.weight"] == head
