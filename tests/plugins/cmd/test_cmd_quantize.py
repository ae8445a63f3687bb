"""``tessera quantize``: every target type loads and stays close to the F32 model, the types
written are llama-quantize's, byte-exact ``--pure`` output against llama-quantize, a type
that is not installed refused before writing, and no lost or half files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest

from tessera.cli.main import main
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.errors import TesseraError
from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.quantize import quantize_model
from tessera.plugins.cmd.quantize_types import FILE_TYPES, file_type
from tessera.testing import make_gguf
from tessera.testing.terminal import stderr_on_a_terminal

RUNTIME = Runtime()
DATA = Path(__file__).resolve().parents[2] / "data"
KQUANTS = DATA / "kquants"
MIXES = DATA / "quants" / "mixes"
LLAMA_FILE_TYPES = [name for name, f in FILE_TYPES.items() if f.number < 200]
PROMPT = list(range(3, 200, 7))
# Max abs logit difference to the F32 model, relative to the F32 logits' std, on a random
# n_embd=256 model (measured: f16 0.003, bf16 0.02, q8_0 0.08, q6_k 0.22, fp8 0.47,
# q4_k 0.82, q4_0 0.96). Random N(0, 0.02) weights sit mostly in FP8's subnormal range,
# which is why fp8_e4m3 lands between 6 and 4 bits here.
BOUNDS = {
    "f32": 0.0,
    "f16": 0.01,
    "bf16": 0.05,
    "q8_0": 0.15,
    "q6_k": 0.4,
    "fp8_e4m3": 0.8,
    "q4_k": 1.3,
    "q4_0": 1.5,
}


@pytest.fixture(scope="module")
def model_f32(tmp_path_factory):
    path = tmp_path_factory.mktemp("quantize") / "f32.gguf"
    return make_gguf(path, "llama", n_embd=256, n_ff=512)


def logits(path) -> np.ndarray:
    ctx = Context(load_model(path, RUNTIME, "numpy"), ContextParams(n_ctx=64))
    return ctx.decode(Batch.for_sequence(PROMPT, logits="all"))


@pytest.fixture(scope="module")
def reference_logits(model_f32):
    return logits(model_f32)


def test_bounds_name_file_types_of_different_types():
    assert len({file_type(t).name for t in BOUNDS}) == len(BOUNDS)


@pytest.mark.parametrize("target", list(BOUNDS))
def test_each_type_loads_and_stays_close_to_f32(tmp_path, model_f32, reference_logits, target):
    out = quantize_model(model_f32, tmp_path / "out.gguf", target, RUNTIME)
    path = tmp_path / "out.gguf"
    f = read_gguf(path)
    assert f.metadata["general.file_type"] == file_type(target).number
    assert ("general.quantization_version" in f.metadata) == (target not in {"f32", "f16", "bf16"})
    for name, t in f.tensors.items():
        assert RUNTIME.quant_type(t.ggml_type).name == out["types"][name]
        if len(t.shape) == 1:
            assert t.ggml_type == 0
    got = logits(path)
    diff = np.abs(got - reference_logits).max() / reference_logits.std()
    assert diff <= BOUNDS[target]
    if target == "f32":
        assert path.read_bytes()[-1000:] == Path(model_f32).read_bytes()[-1000:]


def test_default_mix_follows_llama_cpp(tmp_path, model_f32):
    types = quantize_model(model_f32, tmp_path / "q4k.gguf", "q4_k", RUNTIME)["types"]
    assert types["output.weight"] == "Q6_K"
    assert types["token_embd.weight"] == "Q4_K"
    assert types["output_norm.weight"] == "F32"
    # two layers: only layer 1 (the last eighth) gets more bits in attn_v and ffn_down
    assert types["blk.1.attn_v.weight"] == types["blk.1.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_v.weight"] == types["blk.0.ffn_down.weight"] == "Q4_K"
    assert types["blk.1.attn_q.weight"] == types["blk.1.ffn_up.weight"] == "Q4_K"
    pure = quantize_model(model_f32, tmp_path / "pure.gguf", "q4_k", RUNTIME, pure=True)
    assert {t for n, t in pure["types"].items() if "norm" not in n} == {"Q4_K"}
    q8 = quantize_model(model_f32, tmp_path / "q8.gguf", "q8_0", RUNTIME)["types"]
    assert q8["output.weight"] == "Q8_0"


def bundled(name: str) -> Path:
    return default_model_path().with_name(f"{name}.gguf")


@pytest.mark.parametrize(
    "model, ftype",
    [("tessera-default", f) for f in LLAMA_FILE_TYPES]
    + [("tessera-moe", f) for f in ("MXFP4_MOE", "Q4_K_M", "Q3_K_L")],
)
def test_the_bundled_models_get_llama_quantize_s_types(tmp_path, model, ftype):
    """End to end, the written file's types against llama-quantize's on the same file
    (the default model's ``n_ff`` 704 makes the 256-block types fall back; the MoE model is
    Q8_0, so it is requantized, with 8 experts)."""
    record = json.loads((MIXES / f"{model}.json").read_text(encoding="utf-8"))
    want = dict(zip(record["names"], record["mixes"][ftype], strict=True))
    out = tmp_path / "out.gguf"
    quantize_model(bundled(model), out, ftype, RUNTIME)
    f = read_gguf(out)
    assert {n: gguf.GGMLQuantizationType(t.ggml_type).name for n, t in f.tensors.items()} == want
    assert f.metadata["general.file_type"] == file_type(ftype).number


def test_a_type_no_plugin_provides_is_refused_before_writing(tmp_path, model_f32):
    """Q4_K_M needs Q6_K for the head: without the Q6_K plugin, one sentence names it."""
    runtime = Runtime(disabled=["quant-q6_k"])
    out = tmp_path / "out.gguf"
    with pytest.raises(TesseraError) as raised:
        quantize_model(model_f32, out, "Q4_K_M", runtime)
    assert str(raised.value) == (
        "Q4_K_M needs quant type Q6_K, which no installed plugin provides; install the "
        "plugin that registers it or choose another type"
    )
    assert not out.exists() and os.listdir(tmp_path) == []


QUANTS = DATA / "quants"
#: (llama-quantize's output, its source, the TYPE it was given) of every --pure vector.
PURE_VECTORS = [
    (KQUANTS / f"llama-quantize-pure-{t}.gguf", KQUANTS / "source-f32.gguf", t)
    for t in ("Q4_K", "Q6_K")
] + [
    (QUANTS / f"llama-quantize-pure-{kind}{t}.gguf", QUANTS / f"{source}-f32.gguf", ftype)
    for kind, source in (("", "source"), ("edge-", "edge"))
    for t, ftype in [(t, t) for t in ("Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL",
                                      "IQ4_XS", "TQ1_0", "TQ2_0")] + [("MXFP4", "MXFP4_MOE")]
] + [(QUANTS / "llama-quantize-pure-edge-huge-MXFP4.gguf", QUANTS / "edge-huge-f32.gguf",
      "MXFP4_MOE")]  # fmt: skip


@pytest.mark.parametrize(
    "theirs, source, ftype",
    PURE_VECTORS,
    ids=[f"{v[0].parent.name}-{v[0].stem}" for v in PURE_VECTORS],
)
def test_pure_output_is_byte_exact_with_llama_quantize(tmp_path, theirs, source, ftype):
    """The whole command, fallbacks included (the edge sources' rows of 32)."""
    out = tmp_path / "out.gguf"
    quantize_model(source, out, ftype, RUNTIME, pure=True)
    ours, theirs = read_gguf(out), read_gguf(theirs)
    assert ours.metadata["general.file_type"] == theirs.metadata["general.file_type"]
    assert set(ours.tensors) == set(theirs.tensors)
    for tensor_name, t in theirs.tensors.items():
        o = ours.tensors[tensor_name]
        assert (o.ggml_type, o.shape) == (t.ggml_type, t.shape)
        assert np.asarray(o.data).tobytes() == np.asarray(t.data).tobytes(), tensor_name


def test_quantized_source_is_dequantized_then_quantized(tmp_path, model_f32):
    q8 = tmp_path / "q8.gguf"
    quantize_model(model_f32, q8, "q8_0", RUNTIME)
    quantize_model(q8, tmp_path / "q6.gguf", "q6_k", RUNTIME, pure=True)
    src, out = read_gguf(q8), read_gguf(tmp_path / "q6.gguf")
    q6_k, q8_0 = RUNTIME.quant_type_by_name("Q6_K"), RUNTIME.quant_type_by_name("Q8_0")
    t = src.tensors["blk.0.ffn_up.weight"]
    want = q6_k.quantize_tensor(q8_0.dequantize_tensor(t.data, t.shape))
    assert np.asarray(out.tensors["blk.0.ffn_up.weight"].data).tobytes() == want.tobytes()


def test_rows_that_do_not_fit_fall_back_like_llama_cpp(tmp_path):
    src = make_gguf(tmp_path / "odd.gguf", "llama", n_embd=256, n_ff=320, n_layer=1)
    result = quantize_model(src, tmp_path / "out.gguf", "q6_k", RUNTIME, pure=True)
    # ffn_down has rows of 320 values: no 256-blocks; llama.cpp's fallback for Q6_K is Q8_0
    assert result["types"]["blk.0.ffn_down.weight"] == "Q8_0"
    assert read_gguf(tmp_path / "out.gguf").tensors["blk.0.ffn_down.weight"].ggml_type == 8
    assert result["fallbacks"] == ["blk.0.ffn_down.weight"]
    load_model(tmp_path / "out.gguf", RUNTIME, "numpy")


def test_refuses_to_overwrite_its_input(tmp_path, model_f32):
    src = tmp_path / "in.gguf"
    src.write_bytes(Path(model_f32).read_bytes())
    before = src.read_bytes()
    (tmp_path / "hard.gguf").hardlink_to(src)
    (tmp_path / "soft.gguf").symlink_to(src)
    (tmp_path / "sub").mkdir()
    for out in [src, tmp_path / "hard.gguf", tmp_path / "soft.gguf", tmp_path / "sub/../in.gguf"]:
        with pytest.raises(TesseraError, match="is the input file"):
            quantize_model(src, out, "q8_0", RUNTIME)
    assert src.read_bytes() == before


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failure_mid_write_leaves_no_output(tmp_path, model_f32, monkeypatch, error):
    calls = []

    def failing_write(self, tensor):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return original(self, tensor)

    original = gguf.GGUFWriter.write_tensor_data
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", failing_write)
    out = tmp_path / "out.gguf"
    with pytest.raises(type(error)):
        quantize_model(model_f32, out, "q4_0", RUNTIME)
    assert calls and not out.exists()
    out.write_bytes(b"previous good file")
    calls.clear()
    with pytest.raises(type(error)):
        quantize_model(model_f32, out, "q4_0", RUNTIME)
    assert out.read_bytes() == b"previous good file"
    assert sorted(os.listdir(tmp_path)) == ["out.gguf"]


def test_cli_prints_sizes_and_errors_in_one_line(tmp_path, model_f32, capsys):
    out = tmp_path / "q6.gguf"
    assert main(["quantize", str(model_f32), str(out), "Q6_K"]) == 0
    text = capsys.readouterr().out
    assert "model size =" in text and "quant size =" in text and out.exists()
    assert main(["quantize", str(model_f32), str(tmp_path / "x.gguf"), "q3_z"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "unknown quant type 'q3_z'" in errors[0]
    assert not (tmp_path / "x.gguf").exists()


def test_moe_routers_stay_f32_and_stacked_experts_are_quantized(tmp_path):
    src = make_gguf(tmp_path / "moe.gguf", "qwen3moe", n_embd=256, n_ff_exp=64, n_layer=1)
    result = quantize_model(src, tmp_path / "q6k.gguf", "q6_k", RUNTIME, pure=True)
    # llama-quantize never quantizes the router; 3-D expert stacks follow the row rules
    assert result["types"]["blk.0.ffn_gate_inp.weight"] == "F32"
    assert result["types"]["blk.0.ffn_gate_exps.weight"] == "Q6_K"  # rows of 256
    assert result["types"]["blk.0.ffn_down_exps.weight"] == "Q8_0"  # rows of 64: fallback
    out = read_gguf(tmp_path / "q6k.gguf").tensors["blk.0.ffn_gate_exps.weight"]
    q6_k = RUNTIME.quant_type_by_name("Q6_K")
    assert out.shape == read_gguf(src).tensors["blk.0.ffn_gate_exps.weight"].shape
    assert out.data.size == out.shape[0] * out.shape[1] * q6_k.row_bytes(out.shape[2])
    load_model(tmp_path / "q6k.gguf", RUNTIME, "numpy")


def test_an_output_folder_that_does_not_exist_is_refused_not_created(tmp_path, model_f32, capsys):
    out = tmp_path / "missing" / "deeper" / "out.gguf"
    assert main(["quantize", str(model_f32), str(out), "q8_0"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert f"output folder '{out.parent}' does not exist; create it first" in errors[0]
    assert not (tmp_path / "missing").exists()
    with pytest.raises(TesseraError, match="is a folder"):
        quantize_model(model_f32, tmp_path, "q8_0", RUNTIME)


def test_progress_is_drawn_on_a_terminal_and_never_into_a_pipe(tmp_path, model_f32, capsys):
    out = tmp_path / "q8.gguf"
    with stderr_on_a_terminal() as term:
        assert main(["quantize", str(model_f32), str(out), "Q8_0"]) == 0
    n_tensors = len(read_gguf(model_f32).tensors)
    assert "quantizing to Q8_0" in term.text and f"/{n_tensors}" in term.text
    assert main(["quantize", str(model_f32), str(tmp_path / "again.gguf"), "Q8_0"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "quantizing to" not in captured.out
