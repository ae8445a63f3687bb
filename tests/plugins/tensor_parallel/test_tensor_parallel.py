"""Tensor parallel across processes: parity with one process, refusals and faults.

Every group runs in spawned processes on loopback ports (tessera.plugins.tensor_parallel.testing),
one torch thread per rank, on tiny random models in f32; the oracle is the same model run in
this process without tensor parallelism.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tessera.plugins.tensor_parallel.testing import RankError, generate_rank, run_group, start_group
from tessera.testing.models import make_gguf

PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3, 64, 12, 250]
N_PREDICT = 10


def single_process(path, n_predict=N_PREDICT):
    """Prompt logits (every row) and greedy tokens without tensor parallel (the oracle)."""
    from tessera.engine.batch import Batch
    from tessera.engine.context import Context, ContextParams
    from tessera.engine.generate import generate
    from tessera.engine.sampling import Sampler, SamplerParams
    from tessera.files.load import load_model
    from tessera.plugin_manager import Runtime

    model = load_model(path, Runtime(), "torch", dtype="f32")
    ctx = Context(model, ContextParams(n_ctx=256, n_ubatch=8))
    logits = ctx.decode(Batch.for_sequence(PROMPT, 0, 0, "all"))
    ctx.kv.seq_rm(0)
    tokens = list(generate(ctx, PROMPT, n_predict, Sampler(SamplerParams(temperature=0.0))))
    return logits, tokens


def assert_same_as_single_process(results, path, world_size, communicator):
    assert not any(isinstance(r, RankError) for r in results), results
    logits, tokens, used, stats = results[0]
    ref_logits, ref_tokens = single_process(path)
    assert used == communicator
    assert logits.shape == ref_logits.shape
    # Partial sums meet in a different order than one matmul adds them: f32 rounding only.
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-4, atol=1e-5)
    assert tokens == ref_tokens
    assert results[1:] == [results[1]] * (world_size - 1)  # every other rank ran as many decodes
    return stats


@pytest.fixture(scope="module")
def qwen2_f32(tmp_path_factory):
    return str(make_gguf(tmp_path_factory.mktemp("tp") / "q.gguf", "qwen2", seed=1))


def test_two_ranks_gloo_match_single_process(qwen2_f32):
    results = run_group(2, generate_rank, qwen2_f32, PROMPT, N_PREDICT, "torch-distributed")
    stats = assert_same_as_single_process(results, qwen2_f32, 2, "torch-distributed")
    # Two all-reduces per layer per ubatch; prompt (2 ubatches) twice + one per token.
    n_forward = 2 + 2 + (N_PREDICT - 1)
    assert stats["all_reduce"][0] == 2 * 2 * n_forward
    # The split LM head gathers once per forward with output rows: all but the first
    # ubatch of generate()'s prompt, which wants no logits.
    assert stats["all_gather"][0] == n_forward - 1


def test_two_ranks_pairwise_on_q8_0_with_a_replicated_head_match_single_process(tmp_path):
    path = str(make_gguf(tmp_path / "q8.gguf", "qwen2", qtype="q8_0", seed=2))
    results = run_group(2, generate_rank, path, PROMPT, N_PREDICT, "pairwise", 30.0, False)
    stats = assert_same_as_single_process(results, path, 2, "pairwise")
    assert "all_gather" not in stats  # the head is whole on every rank


def test_four_ranks_gloo_on_a_model_whose_heads_divide(tmp_path):
    path = str(
        make_gguf(tmp_path / "l.gguf", "llama", n_head=8, n_head_kv=4, seed=3, tied_embeddings=True)
    )
    results = run_group(4, generate_rank, path, PROMPT, N_PREDICT, "torch-distributed")
    assert_same_as_single_process(results, path, 4, "torch-distributed")


def test_three_ranks_without_a_collective_communicator_are_refused(tmp_path):
    path = str(make_gguf(tmp_path / "t.gguf", "llama", n_embd=48, n_head=6, n_head_kv=3, n_ff=96))
    env = {"TESSERA_DISABLE_PLUGINS": "comm-torch-distributed"}
    results = run_group(3, generate_rank, path, PROMPT, 2, None, 20.0, env=env)
    for r in results:
        assert isinstance(r, RankError) and r.type == "CommunicatorError", r
        assert "no communicator can connect these 3 ranks" in r.message
        assert "pairwise connects at most 2 ranks" in r.message


def test_heads_that_do_not_divide_are_refused_before_loading(qwen2_f32):
    from tessera.errors import TesseraError
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.shard import load_model_shard

    with pytest.raises(TesseraError, match=r"KV heads \(2\) do not divide by --tp 4"):
        load_model_shard(qwen2_f32, Runtime(), 0, 4, "torch")


@pytest.mark.parametrize(
    "victim, communicator, sig",
    [
        (1, "torch-distributed", signal.SIGKILL),
        (0, "pairwise", signal.SIGKILL),
        (1, "pairwise", signal.SIGSTOP),  # a hung rank: alive, silent
    ],
    ids=["kill-rank1-gloo", "kill-rank0-pairwise", "hang-rank1-pairwise"],
)
def test_a_rank_that_dies_or_hangs_mid_generation_stops_the_other_within_the_timeout(
    qwen2_f32, victim, communicator, sig
):
    import multiprocessing

    timeout_s = 8.0
    progress = multiprocessing.get_context("spawn").Queue()
    group = start_group(
        2, generate_rank, qwen2_f32, PROMPT, 200, communicator, timeout_s, True, progress
    )
    assert progress.get(timeout=120) >= 1  # rank 0 is generating
    progress.get(timeout=60)
    os.kill(group.processes[victim].pid, sig)
    killed = time.monotonic()
    survivor = 1 - victim
    try:
        result = group.results.get(timeout=timeout_s + 20)
    finally:
        os.kill(group.processes[victim].pid, signal.SIGKILL)
        group.collect(timeout_s=5)
    assert time.monotonic() - killed < timeout_s + 5
    assert result[0] == survivor
    result = result[1]
    assert isinstance(result, RankError) and result.type == "CommunicatorError", result
    assert "restart every rank" in result.message


def test_run_cli_with_tp_2_prints_the_single_process_text(qwen2_f32):
    def run(*extra):
        cmd = [sys.executable, "-m", "tessera", "run", "-m", qwen2_f32, "-p", "hello there"]
        cmd += ["-n", "8", "--temp", "0", "--dtype", "f32", "-t", "1", *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out

    single, tp = run(), run("--tp", "2", "--communicator", "pairwise")
    assert tp.stdout == single.stdout and single.stdout.strip()
    assert "tp 2 via pairwise" in tp.stderr


class Recorder:
    """A one-rank communicator that records what rank 0 broadcasts (or replays it)."""

    rank, world_size, path = 0, 1, "memory"

    def __init__(self, replay=None):
        self.sent = []
        self.replay = list(replay) if replay is not None else None

    def broadcast(self, x, root=0):
        if self.replay is not None:
            return self.replay.pop(0)
        self.sent.append(np.array(x))
        return x

    def all_reduce(self, x):
        return x

    def all_gather(self, x):
        return x[None]


def _recording_cells(model):
    """Make ``model``'s graph record the KV cells and mask of every ubatch it runs."""
    seen = []
    forward = model.graph.forward

    def recording(inp):
        seen.append((inp.kv.cells.tolist(), inp.kv.mask.tolist()))
        return forward(inp)

    model.graph.forward = recording
    return seen


def test_lockstep_commands_rebuild_rank_0s_kv_cache_on_another_rank(qwen2_f32):
    from tessera.engine.batch import Batch
    from tessera.engine.context import ContextParams
    from tessera.errors import TesseraError
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.lockstep import (
        OP_CONTEXT,
        OP_DECODE,
        OP_KV,
        OP_STOP,
        TPContext,
        serve_worker,
    )
    from tessera.plugins.tensor_parallel.shard import attach, load_model_shard

    runtime = Runtime()
    rank0 = Recorder()
    model = attach(load_model_shard(qwen2_f32, runtime, 0, 1, "numpy"), rank0)
    seen0 = _recording_cells(model)
    ctx = TPContext(model, ContextParams(n_ctx=64, n_ubatch=4, n_seq_max=2), rank0)
    ctx.decode(Batch.for_sequence(PROMPT[:6], 0, 0, "last"))
    ctx.kv.seq_cp(0, 1, 0, 3)
    ctx.kv.seq_rm(0, 2)
    ctx.decode(Batch([9, 10], [2, 3], [0, 1], [True, True]))
    with pytest.raises(TesseraError, match="token ids must be in"):
        ctx.decode(Batch([10**6], [5], [0], [True]))  # refused before anything is sent
    with pytest.raises(TesseraError, match="run without --tp to use --prompt-cache"):
        ctx.save_state("x.state")
    ctx.stop()
    ops = [int(a[0]) for a in rank0.sent if a.dtype == np.int64 and a.shape == (8,)]
    assert ops == [OP_CONTEXT, OP_DECODE, OP_KV, OP_KV, OP_DECODE, OP_STOP]

    other = attach(load_model_shard(qwen2_f32, runtime, 0, 1, "numpy"), Recorder())
    seen1 = _recording_cells(other)
    assert serve_worker(other, Recorder(replay=rank0.sent)) == 2
    assert len(seen0) == 3 and seen1 == seen0  # same cells, same masks, every ubatch
