"""``--spec-type mtp`` on GLM-4.5's own MTP block (the committed ``glm4moe`` fixture, whose
checkpoint carries one after its two main blocks, as GLM-4.5's do).

- The first draft's logits against an oracle built from transformers' own
  ``Glm4MoeDecoderLayer`` holding the MTP block's weights, fed the target's hidden state
  after ``output_norm`` (llama.cpp's ``t_h_nextn``) and the next token's embedding.
- Greedy output with the MTP drafter equals plain greedy output, engine and ``tessera run``.
- Drafting really happens: with a block that reproduces the main model (block 0 made to add
  nothing, block 1 copied into the MTP block, ``eh_proj`` passing the normalized embedding
  through, embeddings of RMS 1, ``output_norm`` as its head norm) nearly every draft is
  accepted, while the fixture's random block drafts but is not accepted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from tessera.contract.spec import SpecParams
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.engine.generate import GenerationStats, generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.gguf import RawTensor, read_gguf
from tessera.files.gguf_writer import write_gguf
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing.commands import registered_command

RUNTIME = Runtime()
BACKENDS = ["numpy"] + (["torch"] if "torch" in RUNTIME.backends() else [])
#: The committed fixture (tests/data/arch/glm4moe/README.md): two main blocks, one MTP block.
DATA = Path(__file__).resolve().parents[2] / "data" / "arch" / "glm4moe"
GGUF, HF_DIR = DATA / "glm4moe.gguf", DATA / "hf"
PROMPT = np.random.default_rng(7).integers(0, 320, 12).tolist()
N_PREDICT = 32
#: Draft whatever the head's confidence: a random-weight model's next-token distribution
#: is nearly flat, so the default p_min would stop every draft before it starts.
SPEC = SpecParams(draft_max=4, p_min=0.0)


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _mtp_layer(model, weights, il):
    """transformers' decoder layer ``il`` holding the checkpoint's MTP block (experts
    fused as transformers holds them)."""
    layer = type(model.model.layers[-1])(model.config, layer_idx=il).eval()
    p = f"model.layers.{il}."
    state = {k[len(p) :]: torch.from_numpy(v) for k, v in weights.items() if k.startswith(p)}
    n = model.config.n_routed_experts
    expert = [
        [state.pop(f"mlp.experts.{e}.{w}_proj.weight") for e in range(n)]
        for w in ("gate", "up", "down")
    ]
    gate_up = [torch.cat(pair) for pair in zip(expert[0], expert[1], strict=True)]
    state["mlp.experts.gate_up_proj"] = torch.stack(gate_up)
    state["mlp.experts.down_proj"] = torch.stack(expert[2])
    for extra in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        state.pop(extra)
    layer.load_state_dict(state, strict=True)
    return layer


def test_the_first_draft_is_transformers_decoder_layer_on_the_mtp_weights():
    t0, t1 = 17, 123
    model = load_model(GGUF, RUNTIME, "numpy")
    ctx = Context(model, ContextParams(n_ctx=16))
    decoder = create_decoder(RUNTIME, "mtp", ctx, SpecParams())
    ctx.decode(Batch.for_sequence([t0], 0, 0, "all"))  # the prompt: one token
    decoder.begin([t0], 0)
    logits, _ = decoder._catch_up([t0, t1])  # the row (h_0, t_1) at position 1
    decoder.close()

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        HF_DIR, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    weights = load_file(HF_DIR / "model.safetensors")
    il, eps = hf.config.num_hidden_layers, hf.config.rms_norm_eps
    with torch.no_grad():
        h0 = hf.model(torch.tensor([[t0]])).last_hidden_state[0, 0].numpy()  # after the norm
        e1 = weights["model.embed_tokens.weight"][t1]
        p = f"model.layers.{il}."
        x = weights[p + "eh_proj.weight"] @ np.concatenate(
            [_rms(e1, weights[p + "enorm.weight"], eps), _rms(h0, weights[p + "hnorm.weight"], eps)]
        )
        x = torch.from_numpy(x.astype(np.float32))[None, None]
        rotary = hf.model.rotary_emb(x, torch.tensor([[1]]))
        out = _mtp_layer(hf, weights, il)(x, position_embeddings=rotary)[0, 0].numpy()
    want = weights["lm_head.weight"] @ _rms(out, weights[p + "shared_head.norm.weight"], eps)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.fixture(scope="module")
def predicting_head(tmp_path_factory) -> Path:
    """The fixture with an MTP block that reproduces the main model (module docstring)."""
    g = read_gguf(GGUF)
    w = {
        name: np.frombuffer(t.data.tobytes(), np.float32).reshape(t.shape).copy()
        for name, t in g.tensors.items()
    }
    w["blk.0.attn_output.weight"][:] = 0
    w["blk.0.ffn_down.weight"][:] = 0
    e = w["token_embd.weight"]
    w["token_embd.weight"] = e / np.maximum(np.sqrt((e * e).mean(-1, keepdims=True)), 1e-12)
    for name in [n for n in w if n.startswith("blk.1.")]:
        w["blk.2." + name.removeprefix("blk.1.")] = w[name].copy()
    n = w["token_embd.weight"].shape[1]
    w["blk.2.nextn.eh_proj.weight"] = np.eye(n, 2 * n, dtype=np.float32)
    w["blk.2.nextn.enorm.weight"][:] = 1.0
    w["blk.2.nextn.shared_head_norm.weight"] = w["output_norm.weight"].copy()
    raws = [RawTensor(k, 0, v.shape, v.view(np.uint8).reshape(-1)) for k, v in w.items()]
    return write_gguf(tmp_path_factory.mktemp("mtp") / "predicting.gguf", dict(g.metadata), raws)


def _greedy(path: Path, backend: str, spec: bool) -> tuple[list[int], GenerationStats]:
    model = load_model(path, RUNTIME, RUNTIME.create_backend(backend, dtype="f32"))
    ctx = Context(model, ContextParams(n_ctx=96))
    stats = GenerationStats()
    decoder = create_decoder(RUNTIME, "mtp", ctx, SPEC) if spec else None
    sampler = Sampler(SamplerParams(temperature=0))
    tokens = generate(ctx, PROMPT, N_PREDICT, sampler, decoder=decoder, spec=SPEC, stats=stats)
    return list(tokens), stats


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head", ["fixture", "predicting"])
def test_greedy_output_with_mtp_equals_plain_greedy_output(head, backend, predicting_head):
    path = GGUF if head == "fixture" else predicting_head
    plain, _ = _greedy(path, backend, spec=False)
    drafted, stats = _greedy(path, backend, spec=True)
    assert drafted == plain
    assert stats.n_drafted > 0  # the head proposed tokens, which the target verified
    if head == "predicting":
        assert stats.n_accepted >= 0.9 * stats.n_drafted
    else:  # random weights: the head's guesses are the target's only by chance
        assert stats.n_accepted <= 0.25 * stats.n_drafted


def test_tessera_run_with_spec_type_mtp_prints_what_plain_run_prints(predicting_head, capsys):
    command = registered_command("tessera.plugins.cmd.run", "run")
    parser = argparse.ArgumentParser(prog="tessera run")
    command.add_arguments(parser)
    base = ["-m", str(predicting_head), "-p", "The for statement", "-n", "24", "--temp", "0"]
    outs = []
    for extra in ([], ["--spec-type", "mtp", "--draft-p-min", "0"]):
        assert command.run(parser.parse_args([*base, "--backend", "numpy", *extra]), RUNTIME) == 0
        captured = capsys.readouterr()
        outs.append(captured.out)
    assert outs[0] == outs[1]
    counters = captured.err.split("speculative (mtp): drafted ")[1].split()
    drafted, accepted = int(counters[0].rstrip(",")), int(counters[2])
    assert drafted > 0 and accepted >= 0.9 * drafted
