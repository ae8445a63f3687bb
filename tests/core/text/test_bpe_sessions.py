"""The whitespace and hybriddna BPE models, against llama.cpp (llama-cpp-variants.json and
the synthetic vocabularies' own test files)."""

from __future__ import annotations

from tokenizer_vectors import metadata, recorded

from tessera.text.bpe_sessions import DNA_KMER_MARKER
from tessera.text.tokenizer import Tokenizer


def test_whitespace_model_without_lowercasing() -> None:
    variant = recorded("variants")["synthetic-whitespace.gguf"][0]
    meta = {
        k: v for k, v in metadata("synthetic-whitespace.gguf").items() if k not in variant["keys"]
    }
    tok = Tokenizer.from_gguf_metadata(meta)
    texts = recorded("variants")["texts"]
    assert [tok.encode(t) for t in texts] == variant["ids"]
    assert tok.encode("Hello") != tok.encode("hello")


def test_dna_kmers_render_without_their_marker() -> None:
    tok = Tokenizer.from_gguf_metadata(metadata("synthetic-hybriddna.gguf"))
    kmer = tok.token_id("ACGTAC" + DNA_KMER_MARKER)
    assert kmer is not None and tok.token_to_piece(kmer) == "ACGTAC"
    ids = tok.encode("<dna>acgtac</dna>", add_special=False)
    assert ids == [tok.token_id("<dna>"), kmer, tok.token_id("</dna>")]
