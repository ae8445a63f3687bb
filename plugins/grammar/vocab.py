"""The model's vocabulary as llguidance sees it: every token's bytes, its special tokens and
its end-of-generation tokens, turned into an ``LLTokenizer`` once per tokenizer."""

from __future__ import annotations

from typing import Any

from tessera.contract.constraints import ConstraintSpecError


class _ByteVocab:
    """The object ``llguidance.TokenizerWrapper`` reads: token bytes, ids, an encoder."""

    def __init__(self, tokenizer: Any) -> None:
        n = int(tokenizer.n_vocab)
        eog = [i for i in range(n) if tokenizer.is_eog(i)]
        if not eog:
            raise ConstraintSpecError(
                "this tokenizer has no end-of-generation token, so constrained output cannot "
                "end; use a model whose vocabulary sets tokenizer.ggml.eos_token_id"
            )
        self.eog = eog
        self.eos_token_id = eog[0]
        self.bos_token_id = None
        # special tokens keep their text; llguidance never matches grammar text against them
        self.special_token_ids = [i for i in range(n) if tokenizer.is_special(i)]
        self.tokens = [tokenizer.token_to_bytes(i) for i in range(n)]
        self._tokenizer = tokenizer

    def __call__(self, data: bytes | str) -> list[int]:
        text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
        return self._tokenizer.encode(text, add_special=False)


def ll_tokenizer(tokenizer: Any) -> Any:
    """An ``llguidance.LLTokenizer`` over ``tokenizer``'s vocabulary (seconds for 150k
    tokens: build it once per tokenizer)."""
    import llguidance

    vocab = _ByteVocab(tokenizer)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), eos_token=vocab.eog)
