"""Fill-in-the-middle: the model's FIM tokens and the prompt ``/infill`` lays out with them.

The tokens are read as llama.cpp reads them: the GGUF keys
``tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`` (and the older
``prefix``/``suffix``/``middle_token_id``); a key that is absent is looked for by the
token's spelling in the vocabulary (Qwen's ``<|fim_prefix|>``, CodeLlama's ``▁<PRE>``,
DeepSeek's ``<｜fim▁begin｜>`` ...); an id outside the vocabulary counts as absent.

The layout is llama-server's (``format_prompt_infill``)::

    [extra] [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>

where ``extra`` is, with FIM_REP and FIM_SEP tokens (the repo-level pattern),
``<FIM_REP>myproject\\n <FIM_SEP>{filename}\\n{text} ... <FIM_SEP>filename\\n``, and
without them each chunk's text after a ``\\n\\n--- snippet ---\\n\\n`` line. The ``prompt``
(text already typed on the cursor's line) continues the prefix. The prefix keeps its last
3/4 of a batch, the suffix its first quarter less the prompt, the extra context its last
tokens that leave room for the batch and twice ``n_predict``. ``--spm-infill`` puts the
suffix part first (suffix-prefix-middle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

#: GGUF keys of each FIM token, newest first.
FIM_KEYS: dict[str, tuple[str, ...]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}

#: Spellings llama.cpp recognises when a key is absent (model families in brackets).
FIM_SPELLINGS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
            "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
            "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
            "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}  # fmt: skip

#: What separates extra chunks when the model has no FIM_SEP token.
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
#: The repository and current-file names of the repo-level pattern (llama-server's).
REPO_NAME = "myproject"
FILE_NAME = "filename"


@attrs.frozen
class FimTokens:
    """The FIM token ids of a vocabulary (None: the model has no such token)."""

    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None

    def missing(self) -> list[str]:
        """The tokens infill needs and the model lacks (``prefix``, ``suffix``, ``middle``)."""
        names = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
        return [names[k] for k in ("pre", "suf", "mid") if getattr(self, k) is None]


def fim_tokens(metadata: Mapping[str, Any], tok: Any) -> FimTokens:
    """The FIM tokens of a model, from its metadata, else by spelling in ``tok``'s vocabulary."""
    found: dict[str, int | None] = {}
    for role, keys in FIM_KEYS.items():
        ids = [metadata[k] for k in keys if isinstance(metadata.get(k), int)]
        if not ids:
            ids = [t for t in map(tok.token_id, FIM_SPELLINGS[role]) if t is not None]
        found[role] = next((int(t) for t in ids if 0 <= t < tok.n_vocab), None)
    return FimTokens(**found)


@attrs.frozen
class InfillParts:
    """The pieces of an infill request, as token ids (``extra``: ``(filename, text)``)."""

    prefix: Sequence[int]
    suffix: Sequence[int]
    prompt: Sequence[int]
    extra: Sequence[tuple[str, str]] = ()


def infill_prompt(
    tok: Any,
    fim: FimTokens,
    parts: InfillParts,
    *,
    n_batch: int,
    n_predict: int,
    n_ctx: int,
    spm: bool = False,
) -> list[int]:
    """The token ids llama-server evaluates for an infill request (see the module doc)."""

    def text(s: str) -> list[int]:
        return tok.encode(s, add_special=False, parse_special=False)

    extra: list[int] = []
    if fim.rep is not None:
        extra += [fim.rep, *text(REPO_NAME + "\n")]
    for filename, body in parts.extra:
        if fim.sep is not None:
            extra += [fim.sep, *text(filename + "\n")]
        else:
            extra += text(SNIPPET_SEPARATOR)
        extra += text(body)
    if fim.sep is not None:
        extra += [fim.sep, *text(FILE_NAME + "\n")]

    # the prefix and suffix fit one batch, 3:1; the extra context takes what the context
    # has left beside a batch and room to generate
    n_prefix = min(len(parts.prefix), 3 * (n_batch // 4))
    n_suffix = min(len(parts.suffix), max(0, n_batch // 4 - (2 + len(parts.prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    prefix = [fim.pre, *parts.prefix[len(parts.prefix) - n_prefix :], *parts.prompt]
    suffix = [fim.suf, *parts.suffix[:n_suffix]]
    first, second = (suffix, prefix) if spm else (prefix, suffix)
    bos = [tok.bos_id] if tok.add_bos and tok.bos_id is not None else []
    return [*extra[len(extra) - n_extra :], *bos, *first, *second, fim.mid]
