"""POST /infill with plain HTTP on copies of the bundled model whose GGUF names FIM
tokens: the prompt it evaluates is checked token by token against llama-server's order
(built here from /tokenize and the FIM ids), and its greedy answer against /completion
given that prompt; input_extra is checked as llama-server checks it (test_infill.py), and
a model without FIM tokens gets one 400."""

from __future__ import annotations

import pytest

from tessera.plugins.server.testing import FIM_TEST_IDS, call, live_server, write_fim_model

ARGV = ["--backend", "numpy", "-np", "2", "-c", "512", "-b", "64"]
PRE, SUF, MID, REP, SEP = (FIM_TEST_IDS[k] for k in ("pre", "suf", "mid", "rep", "sep"))
BODY = {
    "input_prefix": "def add(a, b):\n",
    "prompt": "    return",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "util.py", "text": "X = 1\n"}],
    "n_predict": 6,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def repo_level(tmp_path_factory):
    model = write_fim_model(tmp_path_factory.mktemp("fim") / "all.gguf")
    with live_server(["-m", str(model), *ARGV]) as srv:
        yield srv


@pytest.fixture(scope="module")
def plain_spm(tmp_path_factory):
    """FIM prefix, suffix and middle only (no repo-level tokens), suffix first."""
    ids = {k: FIM_TEST_IDS[k] for k in ("pre", "suf", "mid")}
    model = write_fim_model(tmp_path_factory.mktemp("fim") / "plain.gguf", ids)
    with live_server(["-m", str(model), *ARGV, "--spm-infill"]) as srv:
        yield srv


def tokens(srv, text: str) -> list[int]:
    """The text's tokens as the server's /tokenize gives them (no BOS, no specials)."""
    body = {"content": text, "add_special": False, "parse_special": False}
    return call(srv.url + "/tokenize", body).json["tokens"]


def infill(srv, **body):
    answer = call(srv.url + "/infill", {**BODY, **body})
    assert answer.status == 200, answer.raw
    return answer.json


def assert_runs_the_prompt(srv, result: dict, expected: list[int]) -> None:
    """The infill evaluated exactly ``expected``: its length, its text, and /completion
    given those tokens answers the same greedy text."""
    assert result["tokens_evaluated"] == len(expected)
    detok = call(srv.url + "/detokenize", {"tokens": expected}).json["content"]
    assert result["prompt"] == detok
    plain = call(srv.url + "/completion", {"prompt": expected, "n_predict": 6, "temperature": 0})
    assert result["content"] == plain.json["content"]
    assert result["tokens_predicted"] == 6 and result["stop"] is True


def test_the_repo_level_pattern_with_fim_rep_and_sep(repo_level):
    r = infill(repo_level)
    t = lambda s: tokens(repo_level, s)  # noqa: E731
    expected = (
        [REP, *t("myproject\n")]
        + [SEP, *t("util.py\n"), *t("X = 1\n")]
        + [SEP, *t("filename\n")]
        + [PRE, *t(BODY["input_prefix"]), *t(BODY["prompt"])]
        + [SUF, *t(BODY["input_suffix"])]
        + [MID]
    )
    assert_runs_the_prompt(repo_level, r, expected)


def test_without_repo_tokens_the_extra_text_follows_a_snippet_line_and_spm_swaps(plain_spm):
    r = infill(plain_spm)
    t = lambda s: tokens(plain_spm, s)  # noqa: E731
    expected = (
        [*t("\n\n--- snippet ---\n\n"), *t("X = 1\n")]
        + [SUF, *t(BODY["input_suffix"])]
        + [PRE, *t(BODY["input_prefix"]), *t(BODY["prompt"])]
        + [MID]
    )
    assert_runs_the_prompt(plain_spm, r, expected)


def test_infill_streams_like_completion(repo_level):
    whole = infill(repo_level)
    events = call(repo_level.url + "/infill", {**BODY, "stream": True}).events
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])


@pytest.mark.parametrize(
    "chunk",
    [{}, {"filename": "ok"}, {"filename": 123}, {"filename": 123, "text": "abc"},
     {"filename": 123, "text": 456}],
)  # fmt: skip
def test_a_bad_input_extra_chunk_is_400(repo_level, chunk):
    answer = call(repo_level.url + "/infill", {**BODY, "input_extra": [chunk]})
    assert answer.status == 400
    error = answer.json["error"]
    assert error["code"] == 400 and error["param"] == "input_extra"


def test_lora_scales_are_refused_as_no_adapter_is_loaded(repo_level):
    answer = call(repo_level.url + "/infill", {**BODY, "lora": [{"id": 1, "scale": 0.5}]})
    assert answer.status == 400 and answer.json["error"]["param"] == "lora"
    assert "no LoRA adapter has id 1" in answer.json["error"]["message"]


def test_prefix_and_suffix_are_required(repo_level):
    for field in ("input_prefix", "input_suffix"):
        body = {k: v for k, v in BODY.items() if k != field}
        answer = call(repo_level.url + "/infill", body)
        assert answer.status == 400 and answer.json["error"]["param"] == field


def test_a_model_without_fim_tokens_is_one_501_as_llama_server(server):
    answer = call(server.url + "/infill", BODY)
    assert answer.status == 501
    error = answer.json["error"]
    assert error["type"] == "not_supported_error" and error["code"] == 501
    assert "prefix, suffix, middle" in error["message"]
