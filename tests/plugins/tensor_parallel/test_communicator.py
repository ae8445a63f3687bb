"""Communicator selection, master addresses, rendezvous errors and quant-aware slicing."""

import numpy as np
import pytest

from tessera.contract.comm import CommunicatorError, CommunicatorInfo, CommunicatorProbe
from tessera.plugins.tensor_parallel.choice import choose_communicator
from tessera.plugins.tensor_parallel.ports import parse_master

INFOS = {
    "torch-distributed": CommunicatorInfo("torch-distributed", None, None, collective=True),
    "pairwise": CommunicatorInfo("pairwise", None, None, collective=False, max_ranks=2),
}
TORCH = CommunicatorProbe(True, ("gloo",))
TORCH_NCCL = CommunicatorProbe(True, ("gloo", "nccl"))
NO_TORCH = CommunicatorProbe(False, reason="torch is not installed")
PAIR = CommunicatorProbe(True, ("tcp",))


def ranks(*probes):
    return [{"torch-distributed": t, "pairwise": PAIR} for t in probes]


def test_the_collective_communicator_wins_when_every_rank_has_it():
    name, features, why = choose_communicator(INFOS, ranks(TORCH_NCCL, TORCH_NCCL))
    assert (name, features) == ("torch-distributed", ("gloo", "nccl")) and "collective" in why


def test_nccl_is_offered_only_when_every_rank_has_it():
    assert choose_communicator(INFOS, ranks(TORCH_NCCL, TORCH))[1] == ("gloo",)


def test_two_ranks_fall_back_to_pairwise_when_one_lacks_the_collective():
    name, _, why = choose_communicator(INFOS, ranks(TORCH, NO_TORCH))
    assert name == "pairwise" and "fallback" in why


def test_three_ranks_without_collectives_are_refused_with_reasons():
    with pytest.raises(CommunicatorError) as err:
        choose_communicator(INFOS, ranks(TORCH, NO_TORCH, TORCH))
    text = str(err.value)
    assert "no communicator can connect these 3 ranks" in text
    assert "rank 1: torch is not installed" in text and "pairwise connects at most 2" in text


def test_a_requested_communicator_must_be_usable_everywhere(monkeypatch):
    monkeypatch.delenv("TESSERA_COMMUNICATOR", raising=False)
    assert choose_communicator(INFOS, ranks(TORCH, TORCH), "pairwise")[0] == "pairwise"
    with pytest.raises(CommunicatorError, match="not usable on every rank .rank 1: torch is"):
        choose_communicator(INFOS, ranks(TORCH, NO_TORCH), "torch-distributed")
    with pytest.raises(CommunicatorError, match="unknown communicator 'mpi'"):
        choose_communicator(INFOS, ranks(TORCH, TORCH), "mpi")
    monkeypatch.setenv("TESSERA_COMMUNICATOR", "pairwise")
    assert choose_communicator(INFOS, ranks(TORCH, TORCH))[0] == "pairwise"


@pytest.mark.parametrize("text", ["localhost", "host:", ":80", "h:0", "h:70000", "h:x"])
def test_bad_master_addresses_are_refused(text):
    with pytest.raises(CommunicatorError, match="--tp-master must be HOST:PORT"):
        parse_master(text)


def test_master_address_forms():
    assert parse_master("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert parse_master("[::1]:29500") == ("::1", 29500)


def test_joining_an_unresolvable_master_is_reported():
    from tessera.plugins.tensor_parallel.rendezvous import rendezvous

    with pytest.raises(CommunicatorError, match="cannot resolve --tp-master host"):
        rendezvous(1, 2, "no-such-host.invalid", 29500, {}, 2.0, None)


def test_joining_a_master_where_nobody_listens_times_out_clearly():
    from tessera.plugins.tensor_parallel.ports import free_port
    from tessera.plugins.tensor_parallel.rendezvous import rendezvous

    port = free_port("127.0.0.1")
    with pytest.raises(CommunicatorError, match=f"no rank 0 answered at 127.0.0.1:{port}"):
        rendezvous(1, 2, "127.0.0.1", port, {}, 0.5, None)


def test_rank_0_on_an_address_of_another_machine_is_reported():
    from tessera.plugins.tensor_parallel.rendezvous import rendezvous

    with pytest.raises(CommunicatorError, match="rank 0 cannot listen on 192.0.2.1:29500"):
        rendezvous(0, 2, "192.0.2.1", 29500, {}, 0.5, None)


def test_rank_0_waits_only_until_the_timeout_for_missing_ranks():
    from tessera.plugins.tensor_parallel.ports import free_port
    from tessera.plugins.tensor_parallel.rendezvous import rendezvous

    port = free_port("127.0.0.1")
    with pytest.raises(CommunicatorError, match=r"rank\(s\) 1 did not join"):
        rendezvous(0, 2, "127.0.0.1", port, {}, 0.5, None)


@pytest.mark.parametrize("qname", ["F32", "F16", "Q8_0", "Q4_0", "Q4_K"])
def test_slices_of_stored_tensors_equal_slices_of_the_values(qname):
    from tessera.contract.tp import Split
    from tessera.files.gguf import RawTensor
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.shard import slice_tensor

    q = Runtime().quant_type_by_name(qname)
    values = np.random.default_rng(0).standard_normal((6, 512)).astype(np.float32)
    raw = RawTensor("w", q.ggml_type, values.shape, q.quantize_tensor(values).reshape(-1))
    full = q.dequantize_tensor(raw.data, raw.shape)
    rows = slice_tensor(raw, q, Split(0, 2, 4))
    np.testing.assert_array_equal(q.dequantize_tensor(rows.data, rows.shape), full[2:4])
    cols = slice_tensor(raw, q, Split(1, 256, 512))
    np.testing.assert_array_equal(q.dequantize_tensor(cols.data, cols.shape), full[:, 256:])
    padded = slice_tensor(raw, q, Split(0, 4, 8))  # past the end: zero rows
    got = q.dequantize_tensor(padded.data, padded.shape)
    np.testing.assert_array_equal(got[:2], full[4:])
    np.testing.assert_array_equal(got[2:], 0)


def test_a_column_cut_inside_a_quant_block_is_refused():
    from tessera.contract.tp import Split
    from tessera.errors import TesseraError
    from tessera.files.gguf import RawTensor
    from tessera.plugin_manager import Runtime
    from tessera.plugins.tensor_parallel.shard import slice_tensor

    q = Runtime().quant_type_by_name("Q8_0")
    raw = RawTensor("blk.0.ffn_down.weight", q.ggml_type, (2, 64), np.zeros(2 * 68, np.uint8))
    with pytest.raises(TesseraError, match="blocks of 32 values and cannot be split at column 16"):
        slice_tensor(raw, q, Split(1, 16, 48))
