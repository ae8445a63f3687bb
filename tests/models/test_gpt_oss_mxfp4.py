"""gpt-oss with MXFP4 experts, as the published models come: OpenAI's checkpoint layout
(``*_blocks`` / ``*_scales``, tests/data/arch/gpt-oss/hf-mxfp4), the GGUF llama.cpp's
converter repacks it into (GGML MXFP4 experts), and llama-quantize's ``MXFP4_MOE`` of the
F32 GGUF (MXFP4 experts, Q8_0 for the other matrices).

Oracles: transformers dequantizing the MXFP4 folder itself; for llama-quantize's file,
transformers running the weights gguf-py dequantizes from it. ``tessera quantize ...
MXFP4_MOE`` must write llama-quantize's file byte for byte, and tessera's path from
OpenAI's checkpoint (``convert``, then ``quantize MXFP4_MOE``) llama.cpp's expert bytes.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers
from gpt_oss_oracle import (
    BACKENDS,
    HF_DIR,
    HF_MXFP4_DIR,
    LLAMA_CPP_F32,
    LLAMA_CPP_MXFP4,
    LLAMA_QUANTIZE_MXFP4_MOE,
    RUNTIME,
    TOL,
    prompt,
    tessera_greedy,
    tessera_logits,
    transformers_answers,
)

from tessera.files.gguf import read_gguf
from tessera.plugins.cmd.convert import convert_hf_to_gguf
from tessera.plugins.cmd.quantize import quantize_model

EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def types_of(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def test_llama_cpp_repacks_openai_mxfp4_experts_as_ggml_mxfp4():
    types = types_of(LLAMA_CPP_MXFP4)
    assert {t for n, t in types.items() if n.endswith(EXPERTS)} == {"MXFP4"}
    assert types["blk.0.attn_q.weight"] == "F32"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", ["hf-mxfp4", "llama.cpp-gguf"])
def test_mxfp4_experts_give_transformers_logits(source, backend):
    path, truncate = (HF_MXFP4_DIR, None) if source == "hf-mxfp4" else (LLAMA_CPP_MXFP4, True)
    want = transformers_answers(HF_MXFP4_DIR, truncate)[0]
    assert np.abs(tessera_logits(path, backend) - want).max() < TOL


def test_mxfp4_gguf_greedy_continuation_matches_transformers_generate():
    backend = BACKENDS[-1]
    assert tessera_greedy(LLAMA_CPP_MXFP4, backend) == transformers_answers(HF_MXFP4_DIR, True)[1]


def test_the_mxfp4_model_is_another_model():
    """The MXFP4 oracle is not the F32 one (the experts really are quantized)."""
    f32, mxfp4 = transformers_answers(HF_DIR)[0], transformers_answers(HF_MXFP4_DIR)[0]
    assert np.abs(f32 - mxfp4).max() > 0.1


def test_tessera_quantize_mxfp4_moe_writes_llama_quantizes_file(tmp_path):
    out = tmp_path / "mxfp4_moe.gguf"
    quantize_model(LLAMA_CPP_F32, out, "MXFP4_MOE", RUNTIME)
    assert types_of(out) == types_of(LLAMA_QUANTIZE_MXFP4_MOE)
    ours, theirs = read_gguf(out), read_gguf(LLAMA_QUANTIZE_MXFP4_MOE)
    for name, tensor in theirs.tensors.items():
        assert np.asarray(ours.tensors[name].data).tobytes() == np.asarray(tensor.data).tobytes()


def test_tessera_convert_then_quantize_gives_llama_cpps_mxfp4_experts(tmp_path):
    f32 = convert_hf_to_gguf(HF_MXFP4_DIR, tmp_path / "f32.gguf", RUNTIME, "f32")
    quantize_model(f32, tmp_path / "mxfp4_moe.gguf", "MXFP4_MOE", RUNTIME)
    ours, theirs = read_gguf(tmp_path / "mxfp4_moe.gguf"), read_gguf(LLAMA_CPP_MXFP4)
    experts = [n for n in theirs.tensors if n.endswith(EXPERTS)]
    for name in experts:
        want = np.asarray(theirs.tensors[name].data).tobytes()
        assert np.asarray(ours.tensors[name].data).tobytes() == want, name


def hf_state_from_gguf(path) -> dict[str, torch.Tensor]:
    """transformers' parameters from a gpt-oss GGUF, dequantized by gguf-py (not tessera)."""
    values = {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            [int(n) for n in reversed(t.shape)]
        )
        for t in gguf.GGUFReader(str(path)).tensors
    }
    state = {
        "model.embed_tokens.weight": values["token_embd.weight"],
        "model.norm.weight": values["output_norm.weight"],
        "lm_head.weight": values["output.weight"],
    }
    names = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}
    names |= {f"attn_{g}": f"self_attn.{h}_proj" for g, h in zip("qkv", "qkv", strict=True)}
    names |= {"attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.router"}
    n_layer = 1 + max(int(n.split(".")[1]) for n in values if n.startswith("blk."))
    for il in range(n_layer):
        p, hp = f"blk.{il}.", f"model.layers.{il}."
        for g, h in names.items():
            for kind in ("weight", "bias"):
                if f"{p}{g}.{kind}" in values:
                    state[f"{hp}{h}.{kind}"] = values[f"{p}{g}.{kind}"]
        state[hp + "self_attn.sinks"] = values[p + "attn_sinks.weight"]
        gate, up = values[p + "ffn_gate_exps.weight"], values[p + "ffn_up_exps.weight"]
        gate_up = np.stack([gate, up], axis=2).reshape(gate.shape[0], -1, gate.shape[2])
        state[hp + "mlp.experts.gate_up_proj"] = gate_up.transpose(0, 2, 1)
        biases = (values[p + "ffn_gate_exps.bias"], values[p + "ffn_up_exps.bias"])
        state[hp + "mlp.experts.gate_up_proj_bias"] = np.stack(biases, axis=2).reshape(
            biases[0].shape[0], -1
        )
        state[hp + "mlp.experts.down_proj"] = values[p + "ffn_down_exps.weight"].transpose(0, 2, 1)
        state[hp + "mlp.experts.down_proj_bias"] = values[p + "ffn_down_exps.bias"]
    return {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in state.items()}


@pytest.mark.parametrize("backend", BACKENDS)
def test_llama_quantizes_mxfp4_moe_file_gives_transformers_logits_of_its_weights(backend):
    config = transformers.AutoConfig.from_pretrained(HF_DIR)
    config.rope_parameters = config.rope_parameters | {"truncate": True}  # as GGUF runs it
    model = transformers.GptOssForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(hf_state_from_gguf(LLAMA_QUANTIZE_MXFP4_MOE))
    assert not unexpected and not missing
    with torch.no_grad():
        want = model(torch.tensor(prompt())[None]).logits[0].numpy()
    assert np.abs(tessera_logits(LLAMA_QUANTIZE_MXFP4_MOE, backend) - want).max() < TOL
