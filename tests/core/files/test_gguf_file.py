"""The GGUF reader: same metadata and tensors as ``gguf.GGUFReader``; bad files get one error."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter

from tessera.errors import ModelFileError
from tessera.files.gguf import read_gguf
from tessera.testing import make_gguf

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
DATA_FILES = sorted(DATA_DIR.rglob("*.gguf"))
MADE = [
    ("llama", "f32"),
    ("llama", "f16"),
    ("llama", "q8_0"),
    ("llama", "q4_0"),
    ("qwen2", "q8_0"),
    ("qwen3", "f16"),
    ("qwen3", "q4_0"),
]


def reader_value(field):
    """The reader's field as plain Python, decoded as tessera's GGUFReader-based reader did."""
    types = field.types
    if types[0] == GGUFValueType.ARRAY:
        parts = [field.parts[i] for i in field.data]
        if types[-1] == GGUFValueType.STRING:
            return [bytes(p).decode("utf-8", errors="replace") for p in parts]
        if not parts:
            return []
        return np.concatenate([np.asarray(p).reshape(-1) for p in parts]).tolist()
    value = field.parts[field.data[0]]
    if types[0] == GGUFValueType.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    scalar = np.asarray(value).reshape(-1)[0]
    return bool(scalar) if types[0] == GGUFValueType.BOOL else scalar.item()


def flatten(value):
    if isinstance(value, list):
        return [leaf for item in value for leaf in flatten(item)]
    return [value]


def assert_same_as_reader(path: Path, *, nested: bool = False) -> None:
    got = read_gguf(path)
    reader = GGUFReader(path, "r")
    want = {k: reader_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    metadata = dict(got.metadata)
    if nested:  # the reader flattens arrays of arrays; tessera keeps their structure
        metadata = {k: flatten(v) if isinstance(v, list) else v for k, v in metadata.items()}
    np.testing.assert_equal(metadata, want)  # == with NaN equal to NaN (a vocab's scores)
    assert list(got.metadata) == list(want)  # file order
    assert list(got.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        raw = got.tensors[t.name]
        assert raw.ggml_type == int(t.tensor_type)
        assert raw.shape == tuple(reversed(t.shape.tolist()))
        assert raw.data.dtype == np.uint8 and raw.data.ndim == 1
        assert not raw.data.flags.writeable
        assert isinstance(raw.data.base, np.memmap)
        assert raw.data.tobytes() == np.asarray(t.data).tobytes()


@pytest.fixture(scope="module")
def made_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("made")


@pytest.fixture(scope="module")
def tiny_gguf(made_dir):
    return make_gguf(made_dir / "tiny-q8_0.gguf", "llama", qtype="q8_0")


@pytest.mark.parametrize("path", DATA_FILES, ids=[p.name for p in DATA_FILES])
def test_data_file_matches_gguf_reader(path):
    assert_same_as_reader(path)


@pytest.mark.parametrize(("arch", "qtype"), MADE, ids=[f"{a}-{q}" for a, q in MADE])
def test_made_model_matches_gguf_reader(made_dir, arch, qtype):
    path = make_gguf(made_dir / f"{arch}-{qtype}.gguf", arch, qtype=qtype)
    assert read_gguf(path).tensors  # a model, not just a vocabulary
    assert_same_as_reader(path)


def write_every_type(path: Path) -> None:
    """A file with a key of every GGUF value type, nested arrays and several tensor types."""
    w = GGUFWriter(path, "llama")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.true", True)
    w.add_bool("t.false", False)
    w.add_string("t.str", "héllo ✓")
    w.add_string("t.empty_str", "")
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, 1e-5])
    w.add_array("t.bools", [True, False, True])
    w.add_array("t.strs", ["a", "", "ü", "<|im_end|>"])
    w.add_array("t.empty", [])
    w.add_array("t.nested", [[1, 2], [3, 4, 5]])
    w.add_array("t.nested_strs", [["x", "y"], ["z"]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("i8", np.arange(-4, 5, dtype=np.int8).reshape(3, 3))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(1, 2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_value_type_and_alignment_match_gguf_reader(tmp_path):
    path = tmp_path / "types.gguf"
    write_every_type(path)
    assert_same_as_reader(path, nested=True)
    meta = read_gguf(path).metadata
    assert meta["t.nested"] == [[1, 2], [3, 4, 5]]
    assert meta["t.nested_strs"] == [["x", "y"], ["z"]]
    assert meta["t.f32"] == float(np.float32(0.1)) and meta["t.f64"] == 0.1
    assert meta["t.true"] is True and meta["t.false"] is False
    assert type(meta["t.u64"]) is int and meta["t.u64"] == 2**63 + 5
    assert meta["general.alignment"] == 64


def cut_points(path: Path) -> list[int]:
    """Cuts in the header, at the start of every KV pair and tensor info, through the data."""
    reader = GGUFReader(path, "r")
    starts = [f.offset for f in reader.fields.values()] + [t.field.offset for t in reader.tensors]
    near_starts = {s + i for s in starts for i in range(24)}
    data_end = max(int(t.data_offset) + int(t.n_bytes) for t in reader.tensors)
    header = range(len(b"GGUF"), reader.data_offset, 61)
    before_data = range(reader.data_offset - 64, reader.data_offset + 1)
    data = range(reader.data_offset, data_end, 4099)
    ends = [int(t.data_offset) + int(t.n_bytes) - 1 for t in reader.tensors]
    return sorted({*near_starts, *header, *before_data, *data, *ends} - {0, 1, 2, 3})


def test_truncated_file_is_a_model_file_error(tmp_path, tiny_gguf):
    data = tiny_gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    points = cut_points(tiny_gguf)
    for n in points:
        path.write_bytes(data[:n])
        with pytest.raises(ModelFileError, match="truncated") as exc:
            read_gguf(path)
        assert "download or convert it again" in str(exc.value), n


def test_bad_magic_is_not_a_gguf_file(tmp_path, tiny_gguf):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGML" + tiny_gguf.read_bytes()[4:])
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_gguf(path)
    path.write_bytes(b"GG")
    with pytest.raises(ModelFileError, match="is not a GGUF file"):
        read_gguf(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        read_gguf(tmp_path / "nope.gguf")


def test_big_endian_file_is_refused(tmp_path):
    path = tmp_path / "be.gguf"
    w = GGUFWriter(path, "llama", endianess=GGUFEndian.BIG)
    w.add_uint32("llama.block_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="big-endian GGUF file"):
        read_gguf(path)


def patch(path: Path, offset: int, fmt: str, value: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))


def test_unsupported_version(tmp_path, tiny_gguf):
    path = tmp_path / "v1.gguf"
    path.write_bytes(tiny_gguf.read_bytes())
    patch(path, 4, "<I", 1)
    with pytest.raises(ModelFileError, match="GGUF version 1"):
        read_gguf(path)


def test_corrupt_counts_and_types_are_model_file_errors(tmp_path, tiny_gguf):
    data = tiny_gguf.read_bytes()
    path = tmp_path / "bad.gguf"
    key = data.index(b"general.architecture")
    for offset, fmt, value in [
        (8, "<Q", 2**63),  # tensor count
        (16, "<Q", 2**40),  # KV count
        (key - 8, "<Q", 2**62),  # key length
        (key + len(b"general.architecture"), "<I", 99),  # value type
    ]:
        path.write_bytes(data)
        patch(path, offset, fmt, value)
        with pytest.raises(ModelFileError, match="truncated or corrupt"):
            read_gguf(path)


def test_bad_alignment_is_corrupt(tmp_path):
    path = tmp_path / "align.gguf"
    write_every_type(path)
    key = b"general.alignment"
    patch(path, path.read_bytes().index(key) + len(key) + 4, "<I", 48)
    with pytest.raises(ModelFileError, match="general.alignment"):
        read_gguf(path)


def test_unknown_tensor_type_keeps_bytes_up_to_next_tensor(tmp_path):
    path = tmp_path / "unknown.gguf"
    write_every_type(path)
    known = read_gguf(path).tensors
    # the type id follows the name, the rank and the dims in f16's tensor info
    name_at = path.read_bytes().index(b"\x03\x00\x00\x00\x00\x00\x00\x00f16") + 11
    unknown_id = 250
    assert unknown_id not in GGML_QUANT_SIZES
    patch(path, name_at + 4 + 8, "<I", unknown_id)
    gguf = read_gguf(path)
    f16 = gguf.tensors["f16"]
    assert f16.ggml_type == unknown_id and f16.shape == (7,)
    # 7 halves (14 bytes), then padding to the next tensor's 64-byte-aligned start
    assert len(f16.data) == 64
    assert f16.data[:14].tobytes() == known["f16"].data.tobytes()
    assert gguf.tensors["i8"].data.tobytes() == known["i8"].data.tobytes()
