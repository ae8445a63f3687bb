"""``tessera perplexity``: its printed numbers against a numpy reimplementation over the
model's raw logits, and against llama-perplexity's recorded numbers on the same model, text
and weights (tests/data/perplexity); base files both ways; one-line refusals."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from perplexity_output import final_estimate, kld_chunks, kld_statistics, running_estimates

from tessera.cli.main import main
from tessera.engine.batch import Batch
from tessera.engine.context import Context, ContextParams
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.plugins.cmd.kld_base import dequantize_log_probs, read_kld_base

RUNTIME = Runtime()
DATA = Path(__file__).resolve().parents[2] / "data" / "perplexity"
TEXT = DATA / "python-notes.txt"
LLAMA_BASE = DATA / "llama-f16-c32.kld"
RECORD = json.loads((DATA / "llama-perplexity.json").read_text(encoding="utf-8"))
KLD_ARGS = ["-c", "32", "--chunks", "7"]
#: llama.cpp's CPU matmuls round the activations to the weights' dot type, tessera keeps
#: them f32: F16 weights -> f16 activations (unit roundoff 2**-11 = 4.9e-4); Q8_0 and Q4_0
#: weights -> 8-bit Q8_0 blocks (half a step, 1/254 = 3.9e-3 of a block's largest value).
#: Those bound the relative change of a perplexity, a mean over many tokens.
PPL_RTOL = {"F16": 2**-11, "Q8_0": 1 / 254, "Q4_0": 1 / 254}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["perplexity", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def printed(decimals: int) -> float:
    """Half a unit of the last printed digit, the most printing can move a value."""
    return 0.5 * 10.0**-decimals


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def chunk_log_probs(path, tokens, n_ctx: int, n_chunk: int, **params: str) -> list[np.ndarray]:
    """The oracle's input: tessera's forward over each chunk alone (the bundled model adds
    no BOS), the log-softmax of the scored positions in float64; ``params`` more
    ContextParams fields (the KV cache types)."""
    model = load_model(path, RUNTIME, "torch", dtype="f32")
    out = []
    for c in range(n_chunk):
        ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=n_ctx, **params))
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        logits = ctx.decode(Batch.for_sequence(chunk, logits="all"))
        out.append(log_softmax64(logits[n_ctx // 2 : n_ctx - 1]))
    return out


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    model = load_model(default_model_path(), RUNTIME, "numpy")
    return model.tokenizer.encode(TEXT.read_text(encoding="utf-8")[:-1])


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """F16 and the two quantizations llama-perplexity was run on (checked byte for byte)."""
    from tessera.plugins.cmd.quantize import quantize_model

    folder = tmp_path_factory.mktemp("perplexity-models")
    paths = {"F16": default_model_path()}
    for qtype, recorded in RECORD["quantized"].items():
        paths[qtype] = folder / f"{qtype}.gguf"
        quantize_model(default_model_path(), paths[qtype], qtype, RUNTIME)
        h = hashlib.sha256()
        for t in GGUFReader(paths[qtype]).tensors:
            h.update(t.name.encode() + int(t.tensor_type).to_bytes(4, "little"))
            h.update(bytes(t.data))
        assert h.hexdigest() == recorded["tensor_sha256"], f"{qtype} weights changed"
    return paths


def test_perplexity_equals_a_numpy_reimplementation(capsys, tokens):
    code, out, _ = cli(capsys, "-f", str(TEXT), "-c", "64", "--chunks", "4", "-b", "128")
    assert code == 0
    nll = np.concatenate(
        [-lp[np.arange(31), tokens[c * 64 + 33 : (c + 1) * 64]] for c, lp in enumerate(
            chunk_log_probs(default_model_path(), tokens, 64, 4))]
    )  # fmt: skip
    running = [math.exp(nll[: 31 * (c + 1)].mean()) for c in range(4)]
    ppl = math.exp(nll.mean())
    err = math.sqrt(((nll**2).mean() - nll.mean() ** 2) / (len(nll) - 1)) * ppl
    for got, want in zip(running_estimates(out), running, strict=True):
        assert abs(got - want) <= 1e-6 * want + printed(4)
    got_ppl, got_err = final_estimate(out)
    assert abs(got_ppl - ppl) <= 1e-6 * ppl + printed(4)
    assert abs(got_err - err) <= 1e-6 * err + printed(5)


def test_the_kv_cache_types_are_those_of_ctk_and_ctv(capsys, tokens):
    argv = ["-f", str(TEXT), "-c", "64", "--chunks", "2", "--backend", "torch", "--dtype", "f32"]
    ppls = {}
    for kv in ("", "q8_0"):
        code, out, _ = cli(capsys, *argv, *(["-ctk", kv, "-ctv", kv] if kv else []))
        assert code == 0
        ppls[kv] = final_estimate(out)[0]
    log_probs = chunk_log_probs(default_model_path(), tokens, 64, 2, type_k="q8_0", type_v="q8_0")
    nll = np.concatenate(
        [-lp[np.arange(31), tokens[c * 64 + 33 : (c + 1) * 64]] for c, lp in enumerate(log_probs)]
    )
    want = math.exp(nll.mean())
    assert abs(ppls["q8_0"] - want) <= 1e-6 * want + printed(4)
    assert abs(ppls["q8_0"] - ppls[""]) > 10 * printed(4)  # a q8_0 cache is not the f32 one


def test_kl_divergence_equals_a_numpy_reimplementation(capsys, tmp_path, tokens, models):
    base_path = tmp_path / "f16.kld"
    assert cli(capsys, "-f", str(TEXT), *KLD_ARGS, "--kl-divergence-base", str(base_path))[0] == 0
    code, out, _ = cli(
        capsys, "-m", str(models["Q4_0"]), "--kl-divergence-base", str(base_path), "--kl-divergence"
    )
    assert code == 0
    base = read_kld_base(base_path)
    q = chunk_log_probs(models["Q4_0"], tokens, 32, 7)
    kld, nll, nll_base, p_diff, same = [], [], [], [], 0
    for c in range(7):
        b = dequantize_log_probs(base.chunk_rows(c), 4096).astype(np.float64)
        nxt = tokens[c * 32 + 17 : (c + 1) * 32]
        keep = b > -16
        kld += list(np.where(keep, np.exp(b) * (b - q[c]), 0).sum(axis=1))
        nll += list(-q[c][np.arange(15), nxt])
        nll_base += list(-b[np.arange(15), nxt])
        p_diff += list(np.exp(q[c][np.arange(15), nxt]) - np.exp(b[np.arange(15), nxt]))
        same += int((q[c].argmax(1) == b.argmax(1)).sum())
    kld, p_diff = np.sort(kld), np.sort(p_diff)
    n = len(kld)
    stats = kld_statistics(out)
    # The command takes llama.cpp's float32 steps (test_kld_stats checks those row by row
    # to 1e-6); here float64 math: a token's KLD sums p_i * (b_i - log q_i) with the bracket
    # rounded to float32 at magnitudes up to ~16 (an ulp is 1.9e-6) and the p_i summing to
    # one, so it may move by about 1e-6 (measured 5.8e-7); nll and p are exact enough.
    f32_noise = 1e-6
    # (label: oracle value, printed decimals, float32 slack); percent lines in percent
    expect = {
        "Mean PPL(Q)": (math.exp(np.mean(nll)), 6, 0.0),
        "Mean PPL(base)": (math.exp(np.mean(nll_base)), 6, 0.0),
        "Mean KLD": (kld.mean(), 6, f32_noise),
        "Maximum KLD": (kld[-1], 6, f32_noise),
        "99.0% KLD": (np.percentile(kld, 99), 6, f32_noise),
        "Median KLD": (np.median(kld), 6, f32_noise),
        "Minimum KLD": (kld[0], 6, f32_noise),
        "Mean Δp": (100 * p_diff.mean(), 3, 100 * f32_noise),
        "90.0% Δp": (100 * np.percentile(p_diff, 90), 3, 100 * f32_noise),
        "Same top p": (100 * same / n, 3, 0.0),
    }
    for label, (want, decimals, slack) in expect.items():
        got = stats[label][0]
        assert abs(got - want) <= 1e-6 * abs(want) + printed(decimals) + slack, label
    dkld = math.sqrt(max((kld**2).mean() - kld.mean() ** 2, 0) / (n - 1))
    assert abs(stats["Mean KLD"][1] - dkld) <= 1e-6 * dkld + printed(6) + f32_noise
    assert len(kld_chunks(out)) == 7


@pytest.mark.parametrize("run", ["c512", "c32"])
def test_perplexity_matches_llama_perplexity(capsys, tmp_path, run):
    recorded = RECORD["perplexity"][run]
    extra = KLD_ARGS if run == "c32" else []
    code, out, _ = cli(capsys, "-f", str(TEXT), *extra)
    assert code == 0
    got = running_estimates(out)
    assert len(got) == len(recorded["running"])
    for mine, theirs in zip(got, recorded["running"], strict=True):
        assert mine == pytest.approx(theirs, rel=PPL_RTOL["F16"])
    ppl, err = final_estimate(out)
    assert ppl == pytest.approx(recorded["ppl"], rel=PPL_RTOL["F16"])
    assert err == pytest.approx(recorded["uncertainty"], rel=PPL_RTOL["F16"])


@pytest.mark.parametrize("name", ["F16", "Q8_0", "Q4_0"])
def test_kl_divergence_from_llama_cpp_s_base_matches_llama_perplexity(capsys, models, name):
    code, out, _ = cli(
        capsys, "-m", str(models[name]), "--kl-divergence-base", str(LLAMA_BASE), "--kl-divergence"
    )
    assert code == 0
    mine = kld_statistics(out)
    runs = RECORD["kl_divergence"][name]
    theirs = runs["llama_f16_base"]["statistics"]
    # read from the file alone: the same to the last printed digit
    assert mine["Mean PPL(base)"] == pytest.approx(theirs["Mean PPL(base)"], abs=1.5e-6)
    assert mine["Mean PPL(Q)"][0] == pytest.approx(theirs["Mean PPL(Q)"][0], rel=PPL_RTOL[name])
    n_tokens = 7 * 15
    assert abs(mine["Same top p"][0] - theirs["Same top p"][0]) <= 100 / n_tokens + 1e-3
    # llama.cpp's KLD = tessera's + its own arithmetic's divergence from tessera's on the same
    # weights (k_a, recorded) + a cross term that Cauchy-Schwarz bounds by 2 sqrt(k_t k_a)
    # (second order in small differences); + the printed rounding of the three numbers
    k_l = theirs["Mean KLD"][0]
    k_a = runs["tessera_same_weights_base"]["statistics"]["Mean KLD"][0]
    k_t = mine["Mean KLD"][0]
    assert abs(k_l - k_t - k_a) <= 2 * math.sqrt(max(k_t, 0) * max(k_a, 0)) + 3 * printed(6)


def test_llama_cpp_read_the_base_file_tessera_writes(capsys, tmp_path):
    path = tmp_path / "tessera-f16.kld"
    assert cli(capsys, "-f", str(TEXT), *KLD_ARGS, "--kl-divergence-base", str(path))[0] == 0
    mine, theirs = path.read_bytes(), LLAMA_BASE.read_bytes()
    n_head = 20 + 4 * 32 * 7
    assert len(mine) == len(theirs) and mine[:n_head] == theirs[:n_head]  # sizes, tokens
    ours, llama = read_kld_base(path), read_kld_base(LLAMA_BASE)
    for c in range(7):
        a = dequantize_log_probs(ours.chunk_rows(c), 4096)
        b = dequantize_log_probs(llama.chunk_rows(c), 4096)
        keep = (a > a.max(1, keepdims=True) - 15.9) & (b > b.max(1, keepdims=True) - 15.9)
        # llama.cpp's f16 activations move a log-probability (z_i - logsumexp z) by at most
        # about 2 * 2**-11 * max|z| (max|z| ~ 15 here: 1.5e-2; measured 5e-3)
        assert np.abs(a - b)[keep].max() < 2 * 2**-11 * 16
    # what llama-perplexity printed reading tessera's file, as tessera reads it now
    code, out, _ = cli(capsys, "--kl-divergence-base", str(path), "--kl-divergence")
    recorded = RECORD["kl_divergence"]["F16"]["tessera_f16_base"]["statistics"]
    got = kld_statistics(out)["Mean PPL(base)"]
    assert got == pytest.approx(recorded["Mean PPL(base)"], rel=1e-5)


def test_too_few_tokens_for_statistics_prints_the_chunks_only(capsys):
    code, out, err = cli(
        capsys, "--kl-divergence-base", str(LLAMA_BASE), "--kl-divergence", "--chunks", "2"
    )
    assert code == 0
    assert len(kld_chunks(out)) == 2 and "KL divergence statistics" not in out
    assert "30 scored tokens; the statistics need at least 100" in err


def test_an_interrupted_run_leaves_no_base_file(capsys, tmp_path, monkeypatch):
    import tessera.plugins.cmd.perplexity as command

    def one_chunk_then_ctrl_c(*args):
        real = scored(*args)
        yield next(real)
        raise KeyboardInterrupt

    scored = command.scored_logits
    monkeypatch.setattr(command, "scored_logits", one_chunk_then_ctrl_c)
    path = tmp_path / "base.kld"
    assert cli(capsys, "-f", str(TEXT), *KLD_ARGS, "--kl-divergence-base", str(path))[0] == 130
    assert list(tmp_path.iterdir()) == []
