"""bench/server_load.py's pure parts: percentiles, rows, the side-by-side table, the token
check of a streamed request and the prompts. No server and no llama.cpp are needed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from server_load_client import PROMPTS, _result, prompt_text  # noqa: E402
from server_load_servers import slot_ctx_note  # noqa: E402
from server_load_stats import percentile, ratio, side_by_side, summarize  # noqa: E402


@pytest.mark.parametrize("q", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_percentile_matches_numpy_linear(n: int, q: float) -> None:
    values = list(np.random.default_rng(n).exponential(size=n))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q * 100)))


def test_percentile_of_nothing_is_nan() -> None:
    assert math.isnan(percentile([], 0.5))


def _request(ttft: float, gaps: list[float], n_tokens: int = 4, n_prompt: int = 10) -> dict:
    return {"ttft": ttft, "itl": gaps, "n_tokens": n_tokens, "n_prompt": n_prompt, "t": 1.0}


def test_summarize_counts_tokens_over_the_wall_time_and_pools_gaps() -> None:
    results = [_request(0.1, [0.01, 0.03]), _request(0.3, [0.02], n_prompt=14)]
    row = summarize("tessera", 2, results, ["RuntimeError: x"], wall=2.0)
    assert row["out_tok_per_s"] == 4.0  # 8 tokens in 2 s
    assert row["req_per_s"] == 1.0
    assert row["failed"] == 1
    assert row["prompt_tokens_mean"] == 12
    assert row["ttft_p50_ms"] == pytest.approx(200)
    assert row["itl_p50_ms"] == pytest.approx(20)
    assert row["itl_p95_ms"] == pytest.approx(float(np.percentile([10, 30, 20], 95)))


def _row(engine: str, clients: int, tok_s: float, ttft_p95: float) -> dict:
    row = summarize(engine, clients, [_request(0.1, [0.01])], [], wall=1.0)
    return row | {"out_tok_per_s": tok_s, "ttft_p95_ms": ttft_p95}


def test_side_by_side_gives_the_ratios_per_client_count() -> None:
    rows = [
        _row("tessera", 1, 30.0, 100.0),
        _row("llama-server", 1, 20.0, 200.0),
        _row("llama-server", 8, 100.0, 400.0),
        _row("tessera", 8, 80.0, 500.0),
    ]
    lines = side_by_side(rows, "tessera", "llama-server")
    assert len(lines) == 4
    one, eight = (line.strip("| ").split(" | ") for line in lines[2:])
    assert (one[0], one[-2], one[-1]) == ("1", "1.50x", "0.50x")
    assert (eight[0], eight[-2], eight[-1]) == ("8", "0.80x", "1.25x")
    assert len(one) == len(lines[0].strip("| ").split(" | "))


def test_side_by_side_refuses_a_client_count_missing_an_engine() -> None:
    with pytest.raises(ValueError, match="llama-server"):
        side_by_side([_row("tessera", 4, 1.0, 1.0)], "tessera", "llama-server")


def test_ratio_of_a_run_without_good_requests_is_nan() -> None:
    assert math.isnan(ratio(5.0, 0.0))
    assert math.isnan(ratio(float("nan"), 2.0))
    assert ratio(3.0, 2.0) == 1.5


def test_a_request_with_fewer_tokens_than_asked_fails() -> None:
    usage = {"completion_tokens": 15, "prompt_tokens": 9}
    with pytest.raises(RuntimeError, match="15 completion tokens, not the 16"):
        _result(0.0, [0.1, 0.2], usage, 16)
    with pytest.raises(RuntimeError, match="None completion tokens"):
        _result(0.0, [0.1], None, 16)
    ok = _result(0.0, [0.1, 0.25], {"completion_tokens": 16, "prompt_tokens": 9}, 16)
    assert ok["n_tokens"] == 16 and ok["n_prompt"] == 9
    assert ok["ttft"] == pytest.approx(0.1) and ok["itl"] == [pytest.approx(0.15)]


def test_prompts_are_a_sentence_or_the_words_asked_for() -> None:
    assert prompt_text(3) == PROMPTS[3]
    assert prompt_text(len(PROMPTS)) == PROMPTS[0]
    long = prompt_text(5, 40)
    assert len(long.split()) == 40 and long.startswith(PROMPTS[5])


def test_slot_contexts_equal_or_capped_by_llama_server_pass_with_a_note() -> None:
    assert slot_ctx_note(2048, 2048, 4096, 192) == "one slot holds 2048 tokens on both"
    assert "training context, 512" in slot_ctx_note(1536, 512, 512, 96)


@pytest.mark.parametrize(
    ("tessera", "llama", "train", "need", "words"),
    [
        (320, 512, 4096, 80, "multiple of 256"),  # llama.cpp padded the slot
        (1024, 512, 512, 600, "fewer than the 600"),  # a request would not fit
    ],
)
def test_slot_contexts_that_do_not_compare_stop_the_run(
    tessera: int, llama: int, train: int, need: int, words: str
) -> None:
    with pytest.raises(SystemExit, match=words):
        slot_ctx_note(tessera, llama, train, need)
