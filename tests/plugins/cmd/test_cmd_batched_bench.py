"""``tessera batched-bench``: llama-batched-bench's parameters, columns and formulas."""

from __future__ import annotations

import argparse
import json

import pytest

from tessera.contract.commands import Command
from tessera.plugin_manager import Runtime
from tessera.testing.commands import registered_command
from tessera.testing.models import make_gguf

RUNTIME = Runtime()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return make_gguf(tmp_path_factory.mktemp("bb") / "tiny.gguf", "llama", n_layer=1, seed=1)


def _command() -> Command:
    return registered_command("tessera.plugins.cmd.batched_bench", "batched-bench")


def _run(capsys, model, *argv: str) -> str:
    command = _command()
    parser = argparse.ArgumentParser(prog="tessera batched-bench")
    command.add_arguments(parser)
    args = parser.parse_args(["-m", str(model), "--backend", "torch", "--dtype", "f32", *argv])
    assert command.run(args, RUNTIME) == 0
    return capsys.readouterr().out


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_is_registered_through_its_entry_point():
    assert "batched-bench" in RUNTIME.commands()


def test_columns_follow_llama_batched_bench_formulas(tiny_gguf, capsys, monkeypatch):
    monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    out = _run(
        capsys, tiny_gguf, "-npp", "8,16", "-ntg", "3", "-npl", "1,3",
        "--kv-unified", "-fa", "on", "--output-format", "jsonl",
    )  # fmt: skip
    rows = _rows(out)
    assert [(r["pp"], r["tg"], r["pl"]) for r in rows] == [
        (8, 3, 1),
        (8, 3, 3),
        (16, 3, 1),
        (16, 3, 3),
    ]
    for r in rows:
        pp, tg, pl = r["pp"], r["tg"], r["pl"]
        assert r["n_kv"] == pl * (pp + tg)
        assert r["speed_pp"] == pytest.approx(pl * pp / r["t_pp"])
        assert r["speed_tg"] == pytest.approx(pl * tg / r["t_tg"])
        assert r["t"] == pytest.approx(r["t_pp"] + r["t_tg"])
        assert r["speed"] == pytest.approx(r["n_kv"] / r["t"])
        assert r["kv_path"] == "rows" and r["is_pp_shared"] == 0 and r["kv_unified"] == 1
        assert r["n_kv_max"] == 3 * (16 + 3)  # -c 0: what the largest combination needs
        assert r["flash_attn"] == "on"


def test_shared_prompt_counts_it_once(tiny_gguf, capsys):
    out = _run(
        capsys, tiny_gguf, "-npp", "12", "-ntg", "2", "-npl", "4", "-pps", "--kv-unified",
        "--output-format", "json",
    )  # fmt: skip
    (r,) = json.loads(out)
    assert r["is_pp_shared"] == 1
    assert r["n_kv"] == 12 + 4 * 2
    assert r["speed_pp"] == pytest.approx(12 / r["t_pp"])
    assert r["speed_tg"] == pytest.approx(4 * 2 / r["t_tg"])


def test_markdown_table_names_the_path_and_why(tiny_gguf, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_KV_ROWS_DISABLE", "1")
    out = _run(capsys, tiny_gguf, "-npp", "8", "-ntg", "2", "-npl", "2", "--kv-unified")
    lines = out.splitlines()
    assert "kv path: dense (disabled by TESSERA_KV_ROWS_DISABLE=1)" in lines
    header = next(line for line in lines if line.startswith("|    PP"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells == [
        "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s",
        "kv path",
    ]  # fmt: skip
    data = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert data[:4] == ["8", "2", "2", "20"] and data[-1] == "dense"


def test_the_kv_cache_types_are_those_of_ctk_and_ctv(tiny_gguf, capsys):
    argv = ("-npp", "8", "-ntg", "2", "-npl", "1")
    assert "type_k = f32, type_v = f32" in _run(capsys, tiny_gguf, *argv)
    out = _run(capsys, tiny_gguf, *argv, "-ctk", "f16", "-ctv", "bf16")
    assert "type_k = f16, type_v = bf16" in out


def test_without_kv_unified_the_split_cache_takes_the_dense_path(tiny_gguf, capsys, monkeypatch):
    monkeypatch.delenv("TESSERA_KV_ROWS_DISABLE", raising=False)
    out = _run(
        capsys, tiny_gguf, "-npp", "8", "-ntg", "2", "-npl", "1,2", "--output-format", "jsonl"
    )
    rows = _rows(out)
    assert [r["pl"] for r in rows] == [1, 2]
    assert {r["kv_path"] for r in rows} == {"dense"}
    assert rows[0]["kv_path_reason"] == "KV cache split per sequence (not unified)"


def test_combinations_that_do_not_fit_the_context_are_skipped(tiny_gguf, capsys):
    out = _run(
        capsys, tiny_gguf, "-npp", "8", "-ntg", "2", "-npl", "1,4", "-c", "20", "--kv-unified",
        "--output-format", "jsonl",
    )  # fmt: skip
    assert [r["pl"] for r in _rows(out)] == [1]


def test_a_bad_list_is_an_argument_error():
    parser = argparse.ArgumentParser()
    _command().add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["-npl", "1,x"])
