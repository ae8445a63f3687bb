"""Context state files: save -> load -> continue equals an uninterrupted run; bad files are
refused with the context untouched; ``tessera run --prompt-cache`` reuses the prefix."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from tessera.cli.main import main
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.engine.state import FORMAT_VERSION, MAGIC, StateFileError
from tessera.files.load import load_model
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf

RUNTIME = Runtime()
PROMPT = [1, 17, 42, 99, 5, 23, 61, 8]
GREEDY = SamplerParams(temperature=0.0)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("models") / "m.gguf", "llama")


def _backend(name):
    if name == "numpy":
        return RUNTIME.create_backend("numpy")
    return RUNTIME.create_backend("torch", device="cpu", dtype="f32")


@pytest.fixture(scope="module", params=["numpy", "torch"])
def model(request, model_path):
    return load_model(model_path, RUNTIME, _backend(request.param))


def _context(model, n_ctx=64, n_seq_max=1):
    return Context(model, ContextParams(n_ctx=n_ctx, n_batch=64, n_ubatch=16, n_seq_max=n_seq_max))


def _snapshot(ctx):
    backend = ctx.model.backend
    tensors = [backend.to_numpy(t).copy() for t in ctx.kv.k + ctx.kv.v if t is not None]
    return ctx.kv.pos.copy(), ctx.kv.seqs.copy(), tensors


def _assert_unchanged(ctx, snap):
    pos, seqs, tensors = _snapshot(ctx)
    np.testing.assert_array_equal(pos, snap[0])
    np.testing.assert_array_equal(seqs, snap[1])
    for a, b in zip(tensors, snap[2], strict=True):
        np.testing.assert_array_equal(a, b)


def _saved_after(model, path, n_first, params=GREEDY):
    """Generate ``n_first`` tokens, save the state; return (history, sampler)."""
    ctx, sampler = _context(model), Sampler(params)
    first = list(generate(ctx, PROMPT, n_first, sampler))
    history = PROMPT + first
    ctx.save_state(path, 0, history, sampler)
    return history


@pytest.mark.parametrize("params", [GREEDY, SamplerParams(temperature=0.9, seed=7)])
def test_save_load_continue_equals_an_uninterrupted_run(model, model_path, tmp_path, params):
    whole = list(generate(_context(model), PROMPT, 12, Sampler(params)))
    history = _saved_after(model, tmp_path / "s.bin", 5, params)
    assert history == PROMPT + whole[:5]

    # a freshly loaded model of the same file and a sampler with another seed
    fresh = load_model(model_path, RUNTIME, _backend(model.backend.name))
    ctx = _context(fresh)
    sampler = Sampler(SamplerParams(temperature=params.temperature, seed=123))
    tokens = ctx.load_state(tmp_path / "s.bin", 0, sampler)
    assert tokens == history
    assert ctx.kv.seq_pos_max(0) == len(history) - 2  # the last token was never decoded
    # the last history token is evaluated again for its logits
    rest = list(generate(ctx, tokens, 7, sampler, n_past=len(tokens) - 1))
    assert whole[:5] + rest == whole


def test_load_into_another_sequence_and_keep_others(model, tmp_path):
    history = _saved_after(model, tmp_path / "s.bin", 3)
    ctx = _context(model, n_seq_max=2)
    list(generate(ctx, [3, 4, 5], 2, Sampler(GREEDY), seq_id=0))
    seq0 = ctx.kv.seqs == 1
    assert ctx.load_state(tmp_path / "s.bin", 1) == history
    np.testing.assert_array_equal(ctx.kv.seqs == 1, seq0)  # sequence 0 untouched
    assert ctx.kv.seq_pos_max(1) == len(history) - 2


def _rewrite(path, dst, edit):
    data = bytearray(path.read_bytes())
    dst.write_bytes(bytes(edit(data)))
    return dst


def _flip(data):
    data[len(data) // 2] ^= 0x40
    return data


def _flip_version(data):
    data[len(MAGIC) + 2] ^= 0x01  # version 1 reads as 65537
    return data


def _newer(data):
    struct.pack_into("<I", data, len(MAGIC), FORMAT_VERSION + 1)
    data[-32:] = hashlib.sha256(bytes(data[:-32])).digest()
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_flip, "corrupt or truncated"),
        (lambda d: d[: len(d) - 100], "corrupt or truncated"),
        (lambda d: d[:20], "not a tessera context state file"),
        (_newer, f"format version {FORMAT_VERSION + 1}, newer"),
        (_flip_version, "is corrupt \\(checksum mismatch\\) or has state format version 65537"),
    ],
    ids=["flipped-byte", "truncated", "cut-header", "newer-version", "flipped-version-bit"],
)
def test_bad_files_are_refused_and_the_context_is_unchanged(model, tmp_path, edit, message):
    _saved_after(model, tmp_path / "s.bin", 2)
    bad = _rewrite(tmp_path / "s.bin", tmp_path / "bad.bin", edit)
    ctx = _context(model)
    list(generate(ctx, [9, 8, 7, 6], 3, Sampler(GREEDY)))
    snap = _snapshot(ctx)
    with pytest.raises(StateFileError, match=message):
        ctx.load_state(bad)
    _assert_unchanged(ctx, snap)


@pytest.mark.parametrize(("arch", "seed"), [("llama", 1), ("qwen2", 0)])
def test_another_model_is_refused(model, tmp_path, arch, seed):
    _saved_after(model, tmp_path / "s.bin", 2)
    other_path = make_gguf(tmp_path / "other.gguf", arch, seed=seed)
    other = load_model(other_path, RUNTIME, _backend(model.backend.name))
    ctx = _context(other)
    list(generate(ctx, [9, 8, 7], 2, Sampler(GREEDY)))
    snap = _snapshot(ctx)
    with pytest.raises(StateFileError, match="different model"):
        ctx.load_state(tmp_path / "s.bin")
    _assert_unchanged(ctx, snap)


def test_more_cells_than_free_is_refused(model, tmp_path):
    _saved_after(model, tmp_path / "s.bin", 6)  # 13 cells
    ctx = _context(model, n_ctx=64, n_seq_max=2)
    list(generate(ctx, list(range(1, 56)), 1, Sampler(GREEDY), seq_id=1))
    snap = _snapshot(ctx)
    with pytest.raises(StateFileError, match="holds 13 cells but the context has fewer free"):
        ctx.load_state(tmp_path / "s.bin", 0)
    _assert_unchanged(ctx, snap)


def test_torch_state_loads_into_numpy(model_path, tmp_path):
    torch_model = load_model(model_path, RUNTIME, _backend("torch"))
    numpy_model = load_model(model_path, RUNTIME, _backend("numpy"))
    history = _saved_after(torch_model, tmp_path / "s.bin", 4)
    assert _context(numpy_model).load_state(tmp_path / "s.bin") == history


# -- tessera run --prompt-cache ------------------------------------------------------


def _run(capsys, model_path, prompt, *extra):
    argv = ["run", "-m", str(model_path), "-p", prompt, "-n", "8", "--temp", "0"]
    assert main([*argv, "--backend", "numpy", *extra]) == 0
    return capsys.readouterr()


def _n_prompt(err):
    return int(err.split("prompt: ")[1].split(" tokens")[0])


def test_run_prompt_cache_reuses_the_prefix(capsys, model_path, tmp_path):
    cache = tmp_path / "prompt.cache"
    short, long = "The for statement", "The for statement runs a loop over items"
    plain_short, plain_long = _run(capsys, model_path, short), _run(capsys, model_path, long)
    n_short, n_long = _n_prompt(plain_short.err), _n_prompt(plain_long.err)

    first = _run(capsys, model_path, short, "--prompt-cache", str(cache))
    assert first.out == plain_short.out and "prompt cache" not in first.err
    assert cache.exists() and _n_prompt(first.err) == n_short

    again = _run(capsys, model_path, short, "--prompt-cache", str(cache))
    assert again.out == plain_short.out
    assert f"reusing {n_short - 1} of {n_short} prompt tokens" in again.err
    assert _n_prompt(again.err) == 1

    digest = hashlib.sha256(cache.read_bytes()).hexdigest()
    longer = _run(capsys, model_path, long, "--prompt-cache", str(cache), "--prompt-cache-ro")
    assert longer.out == plain_long.out
    reused = int(longer.err.split("reusing ")[1].split(" of")[0])
    assert 0 < reused <= n_short and _n_prompt(longer.err) == n_long - reused
    assert hashlib.sha256(cache.read_bytes()).hexdigest() == digest  # read-only


def test_run_prompt_cache_from_another_model_is_one_error_line(capsys, model_path, tmp_path):
    cache = tmp_path / "prompt.cache"
    _run(capsys, model_path, "hello there", "--prompt-cache", str(cache))
    other = make_gguf(tmp_path / "other.gguf", "llama", seed=3)
    code = main(
        [
            "run",
            "-m",
            str(other),
            "-p",
            "hello",
            "-n",
            "2",
            "--backend",
            "numpy",
            "--prompt-cache",
            str(cache),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: ")
    assert "different model" in err


def test_an_rng_state_the_sampler_cannot_take_is_refused_before_the_cache_changes(model, tmp_path):
    _saved_after(model, tmp_path / "s.bin", 2)

    def other_generator(data):
        at = bytes(data).index(b'"PCG64"')
        data[at + 1 : at + 6] = b"XCG64"  # same length: the header stays well formed
        data[-32:] = hashlib.sha256(bytes(data[:-32])).digest()
        return data

    bad = _rewrite(tmp_path / "s.bin", tmp_path / "bad.bin", other_generator)
    ctx = _context(model)
    list(generate(ctx, [9, 8, 7, 6], 3, Sampler(GREEDY)))
    snap = _snapshot(ctx)
    with pytest.raises(StateFileError, match="RNG state this sampler cannot restore"):
        ctx.load_state(bad, 0, Sampler(GREEDY))
    _assert_unchanged(ctx, snap)
