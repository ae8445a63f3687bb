"""``tessera convert``: GGUF names, keys, layouts and types as llama.cpp's converter writes.

The oracle for names and keys is gguf-py, the package llama.cpp's own converter writes
with: its ``TensorNameMap`` (HF name -> GGUF name), ``MODEL_TENSORS`` / ``TENSOR_NAMES``
(which tensors an arch has) and ``Keys`` (metadata key names). Values are checked with
``gguf.quants.dequantize``.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, LlamaFileType

from tessera.cli.main import main
from tessera.errors import ModelFileError, TesseraError
from tessera.files.gguf import read_gguf
from tessera.files.hf import read_safetensors_dir
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.convert import OUTTYPES, convert_hf_to_gguf
from tessera.testing.models import CHATML_TEMPLATE, make_hf_dir
from tessera.testing.terminal import stderr_on_a_terminal

GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "qwen2": gguf.MODEL_ARCH.QWEN2,
    "qwen3": gguf.MODEL_ARCH.QWEN3,
}
N_LAYER = 2


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    return {
        "llama": make_hf_dir(tmp / "llama", "llama", n_layer=N_LAYER),
        "qwen2": make_hf_dir(tmp / "qwen2", "qwen2", n_layer=N_LAYER, tie_word_embeddings=True),
        "qwen3": make_hf_dir(tmp / "qwen3", "qwen3", n_layer=N_LAYER, head_dim=32),
        # rows of 80 values do not fill 32-value blocks: ffn_down falls back to F16
        "odd_ff": make_hf_dir(tmp / "odd_ff", "llama", n_layer=1, n_ff=80),
    }


def _all_keys(arch: str) -> set[str]:
    keys = set()
    for group in vars(gguf.Keys).values():
        if not isinstance(group, type):
            continue
        for value in vars(group).values():
            if isinstance(value, str):
                keys.add(value.replace("{arch}", arch))
    return keys


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_names_and_keys_are_those_gguf_py_defines(tmp_path, runtime, hf_dirs, arch):
    path = convert_hf_to_gguf(hf_dirs[arch], tmp_path / "m.gguf", runtime, "f32")
    read = read_gguf(path)
    assert read.architecture == gguf.MODEL_ARCH_NAMES[GGUF_ARCH[arch]]
    # Every HF tensor lands under the name llama.cpp's converter gives it, same shape.
    name_map = gguf.get_tensor_name_map(GGUF_ARCH[arch], N_LAYER)
    hf = read_safetensors_dir(hf_dirs[arch])
    for hf_name, value in hf.items():
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name in read.tensors, hf_name
        assert read.tensors[name].shape == value.shape
    assert len(read.tensors) == len(hf)
    allowed = {
        TENSOR.format(bid=b) + suffix
        for TENSOR in (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[GGUF_ARCH[arch]])
        for b in range(N_LAYER)
        for suffix in (".weight", ".bias")
    }
    assert set(read.tensors) <= allowed
    header = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}  # the reader's, not keys
    assert set(read.metadata) - header <= _all_keys(arch)
    fields = GGUFReader(path).fields
    for key in (
        gguf.Keys.LLM.BLOCK_COUNT,
        gguf.Keys.LLM.EMBEDDING_LENGTH,
        gguf.Keys.LLM.FEED_FORWARD_LENGTH,
        gguf.Keys.LLM.CONTEXT_LENGTH,
        gguf.Keys.Attention.HEAD_COUNT,
        gguf.Keys.Attention.HEAD_COUNT_KV,
        gguf.Keys.General.FILE_TYPE,
        gguf.Keys.General.QUANTIZATION_VERSION,
        gguf.Keys.Tokenizer.EOS_ID,
    ):
        assert fields[key.format(arch=arch)].types == [GGUFValueType.UINT32], key
    for key in (gguf.Keys.Attention.LAYERNORM_RMS_EPS, gguf.Keys.Rope.FREQ_BASE):
        assert fields[key.format(arch=arch)].types == [GGUFValueType.FLOAT32], key
    token_type = fields[gguf.Keys.Tokenizer.TOKEN_TYPE]
    assert token_type.types == [GGUFValueType.ARRAY, GGUFValueType.INT32]
    meta = read.metadata
    assert meta[gguf.Keys.General.QUANTIZATION_VERSION] == gguf.GGML_QUANT_VERSION
    assert meta[gguf.Keys.Tokenizer.CHAT_TEMPLATE] == CHATML_TEMPLATE
    hf_vocab = json.loads((hf_dirs[arch] / "tokenizer.json").read_text())["model"]["vocab"]
    tokens = meta[gguf.Keys.Tokenizer.LIST]
    assert all(tokens[i] == t for t, i in hf_vocab.items())


def test_llama_q_and_k_rows_are_interleaved_per_head_and_qwen_rows_are_not(
    tmp_path, runtime, hf_dirs
):
    for arch, permuted in (("llama", True), ("qwen3", False)):
        out = tmp_path / f"{arch}.gguf"
        read = read_gguf(convert_hf_to_gguf(hf_dirs[arch], out, runtime, "f32"))
        hf = read_safetensors_dir(hf_dirs[arch])
        config = json.loads((hf_dirs[arch] / "config.json").read_text())
        heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
        for proj, n_head in heads.items():
            w = hf[f"model.layers.1.self_attn.{proj}_proj.weight"]
            raw = read.tensors[f"blk.1.attn_{proj}.weight"]
            got = raw.data.view(np.float32).reshape(raw.shape)
            order = np.arange(len(w))
            if permuted:  # GGML normal-mode RoPE: row 2i, 2i+1 of a head = rows i, i + D/2
                d = len(w) // n_head
                i = np.arange(d // 2)
                pairs = [np.stack([h * d + i, h * d + d // 2 + i], axis=1) for h in range(n_head)]
                order = np.concatenate(pairs).reshape(-1)
            assert np.array_equal(got, w[order]), (arch, proj)


EXPECTED_2D = {"f32": T.F32, "f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}
FILE_TYPE = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q4_0": LlamaFileType.MOSTLY_Q4_0,
}
# Max abs error for weights of std 0.02 (|w| < ~0.1): half a step of each format.
MAX_ERROR = {"f32": 0.0, "f16": 1e-4, "bf16": 1e-3, "q8_0": 1e-3, "q4_0": 2e-2}


@pytest.mark.parametrize("outtype", list(OUTTYPES))
def test_outtype_sets_tensor_types_file_type_and_values(tmp_path, runtime, hf_dirs, outtype):
    read = read_gguf(convert_hf_to_gguf(hf_dirs["odd_ff"], tmp_path / "m.gguf", runtime, outtype))
    assert read.metadata["general.file_type"] == FILE_TYPE[outtype]
    hf = read_safetensors_dir(hf_dirs["odd_ff"])
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 1)
    for hf_name, value in hf.items():
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        t = read.tensors[name]
        if value.ndim == 1:
            expected = T.F32
        elif name == "blk.0.ffn_down.weight" and outtype in ("q8_0", "q4_0"):
            expected = T.F16
        elif name == "output.weight" and outtype == "q4_0":  # llama-quantize: head keeps bits
            expected = T.Q8_0  # Q6_K needs rows of 256; these have 64
        else:
            expected = EXPECTED_2D[outtype]
        assert t.ggml_type == expected, name
        if "attn_q" in name or "attn_k" in name:
            continue  # permuted rows; the layout test covers them
        decoded = gguf.quants.dequantize(t.data, T(t.ggml_type)).reshape(value.shape)
        assert np.abs(decoded - value).max() <= MAX_ERROR[outtype], name


def test_unknown_outtype_names_the_choices_and_writes_nothing(tmp_path, runtime, hf_dirs):
    with pytest.raises(TesseraError, match="f32, f16, bf16, q8_0, q4_0"):
        convert_hf_to_gguf(hf_dirs["llama"], tmp_path / "m.gguf", runtime, "q5_k")
    assert list(tmp_path.iterdir()) == []


def test_missing_input_folder_is_one_clear_error_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["convert", str(tmp_path / "nope"), str(out), "--outtype", "q8_0"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not exist" in errors[0]
    assert not out.exists()


def test_failed_conversion_keeps_an_existing_output_file(tmp_path, runtime, hf_dirs):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"GGUF previous good file")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in hf_dirs["llama"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    config["num_hidden_layers"] = N_LAYER + 1  # the checkpoint has one layer too few
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match="blk.2"):
        convert_hf_to_gguf(broken, out, runtime, "f16")
    assert out.read_bytes() == b"GGUF previous good file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "m.gguf"]


def test_cli_convert_writes_a_loadable_file(tmp_path, hf_dirs, capsys):
    out = tmp_path / "m.gguf"
    assert main(["convert", str(hf_dirs["qwen2"]), str(out), "--outtype", "Q8_0"]) == 0
    assert "wrote" in capsys.readouterr().out
    read = read_gguf(out)
    assert read.metadata["general.file_type"] == LlamaFileType.MOSTLY_Q8_0
    assert "output.weight" not in read.tensors  # tied embeddings, as llama.cpp writes them


def test_progress_is_drawn_on_a_terminal_and_never_into_a_pipe(tmp_path, hf_dirs, capsys):
    with stderr_on_a_terminal() as term:
        assert main(["convert", str(hf_dirs["llama"]), str(tmp_path / "a.gguf")]) == 0
    n_tensors = len(read_gguf(tmp_path / "a.gguf").tensors)
    assert "converting to f16" in term.text and f"/{n_tensors}" in term.text
    assert main(["convert", str(hf_dirs["llama"]), str(tmp_path / "b.gguf")]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "converting to" not in captured.out
