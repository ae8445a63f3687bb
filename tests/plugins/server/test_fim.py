"""The FIM tokens are found as llama.cpp finds them, and the infill prompt is laid out
token by token in llama-server's order:
``[extra] [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>``, the extra context
in the repo-level pattern when the model has FIM_REP and FIM_SEP tokens."""

from __future__ import annotations

from tessera.plugins.server.fim import FimTokens, InfillParts, fim_tokens, infill_prompt

PRE, SUF, MID, PAD, REP, SEP = 901, 902, 903, 904, 905, 906


class CharTokenizer:
    """One token per character (its code point), a few named specials: each expected
    token below can be read off the text."""

    n_vocab = 1000

    def __init__(self, add_bos: bool = False, names: dict[str, int] | None = None) -> None:
        self.add_bos = add_bos
        self.bos_id = 1
        self.names = names or {}

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False):
        assert not add_special  # infill text never gets a BOS of its own
        return [ord(c) for c in text]

    def token_id(self, text: str) -> int | None:
        return self.names.get(text)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


ALL = FimTokens(pre=PRE, suf=SUF, mid=MID, pad=PAD, rep=REP, sep=SEP)
PARTS = InfillParts(
    prefix=chars("def f():\n"),
    suffix=chars("\nf()\n"),
    prompt=chars("    ret"),
    extra=[("a.py", "x = 1\n"), ("b.py", "y = 2\n")],
)
ROOM = {"n_batch": 2048, "n_predict": -1, "n_ctx": 8192}


def test_repo_level_pattern_with_rep_and_sep_tokens():
    got = infill_prompt(CharTokenizer(), ALL, PARTS, **ROOM)
    want = (
        [REP, *chars("myproject\n")]
        + [SEP, *chars("a.py\n"), *chars("x = 1\n")]
        + [SEP, *chars("b.py\n"), *chars("y = 2\n")]
        + [SEP, *chars("filename\n")]
        + [PRE, *chars("def f():\n"), *chars("    ret")]
        + [SUF, *chars("\nf()\n")]
        + [MID]
    )
    assert got == want


def test_without_rep_and_sep_the_chunks_follow_snippet_lines():
    fim = FimTokens(pre=PRE, suf=SUF, mid=MID)
    got = infill_prompt(CharTokenizer(), fim, PARTS, **ROOM)
    snippet = chars("\n\n--- snippet ---\n\n")
    chunks = [*snippet, *chars("x = 1\n"), *snippet, *chars("y = 2\n")]
    middle = [PRE, *chars("def f():\n    ret"), SUF, *chars("\nf()\n"), MID]
    assert got == chunks + middle


def test_the_extra_context_comes_before_the_bos_and_spm_puts_the_suffix_first():
    tok = CharTokenizer(add_bos=True)
    fim = FimTokens(pre=PRE, suf=SUF, mid=MID, sep=SEP)
    parts = InfillParts(chars("ab"), chars("cd"), chars("e"), [("f", "g")])
    extra = [SEP, *chars("f\n"), *chars("g"), SEP, *chars("filename\n")]
    psm = infill_prompt(tok, fim, parts, **ROOM)
    assert psm == [*extra, 1, PRE, *chars("abe"), SUF, *chars("cd"), MID]
    spm = infill_prompt(tok, fim, parts, **ROOM, spm=True)
    assert spm == [*extra, 1, SUF, *chars("cd"), PRE, *chars("abe"), MID]


def test_prefix_suffix_and_extra_are_cut_to_the_batch_and_context():
    fim = FimTokens(pre=PRE, suf=SUF, mid=MID)
    parts = InfillParts(chars("0123456789ABCDEF"), chars("abcdefgh"), chars("P"), [("f", "xyz")])
    # n_batch 16: the prefix keeps its last 12 tokens, the suffix its first 16/4 - (2 + 1);
    # the extra keeps its last n_ctx - n_batch - 2 * n_predict = 3 tokens
    got = infill_prompt(CharTokenizer(), fim, parts, n_batch=16, n_predict=2, n_ctx=23)
    assert got == [*chars("xyz"), PRE, *chars("456789ABCDEF"), *chars("P"), SUF, ord("a"), MID]
    none_left = infill_prompt(CharTokenizer(), fim, parts, n_batch=16, n_predict=4, n_ctx=20)
    assert none_left[0] == PRE


def test_fim_tokens_come_from_the_gguf_keys_then_the_older_ones():
    meta = {
        "tokenizer.ggml.fim_pre_token_id": 10,
        "tokenizer.ggml.suffix_token_id": 11,  # the older name
        "tokenizer.ggml.middle_token_id": 12,
        "tokenizer.ggml.fim_mid_token_id": 13,  # the newer name wins
        "tokenizer.ggml.fim_sep_token_id": 5000,  # outside the vocabulary: absent
    }
    got = fim_tokens(meta, CharTokenizer())
    assert got == FimTokens(pre=10, suf=11, mid=13, pad=None, rep=None, sep=None)
    assert got.missing() == []
    assert FimTokens(pre=1).missing() == ["suffix", "middle"]


def test_absent_keys_are_found_by_the_token_spellings_llama_cpp_knows():
    qwen = {"<|fim_prefix|>": 20, "<|fim_suffix|>": 21, "<|fim_middle|>": 22}
    qwen |= {"<|fim_pad|>": 23, "<|fim_repo|>": 24, "<|file_sep|>": 25}
    got = fim_tokens({}, CharTokenizer(names=qwen))
    assert got == FimTokens(pre=20, suf=21, mid=22, pad=23, rep=24, sep=25)
    codellama = {"▁<PRE>": 30, "▁<SUF>": 31, "▁<MID>": 32}
    got = fim_tokens({"tokenizer.ggml.fim_pre_token_id": 7}, CharTokenizer(names=codellama))
    assert (got.pre, got.suf, got.mid, got.rep) == (7, 31, 32, None)
    assert fim_tokens({}, CharTokenizer()).missing() == ["prefix", "suffix", "middle"]
