"""Token references of llama.cpp's GBNF dialect through the gbnf constraint kind: ``<[ID]>``
allows exactly that token, ``!<[ID]>`` every token but it, ``<TEXT>`` the special token
of that text; the same characters inside literals, classes and comments stay text. The
masks are compared with masks written out by hand from the vocabulary."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.contract.constraints import ConstraintSpecError
from tessera.files.load import default_model_path
from tessera.plugin_manager import Runtime
from tessera.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_path(default_model_path())


@pytest.fixture(scope="module")
def gbnf():
    return Runtime().constraint_kind("gbnf")


def only(tokenizer, *ids: int) -> np.ndarray:
    mask = np.zeros(tokenizer.n_vocab, dtype=bool)
    mask[list(ids)] = True
    return mask


def test_token_ids_and_negated_ids_allow_what_they_name(gbnf, tokenizer):
    constraint = gbnf.compile("root ::= <[42]> rest\nrest ::= !<[42]> <[7]>", tokenizer)()
    assert np.array_equal(constraint.allowed_mask(), only(tokenizer, 42))
    constraint.accept(42)
    assert np.array_equal(constraint.allowed_mask(), ~only(tokenizer, 42))
    constraint.accept(100)
    assert np.array_equal(constraint.allowed_mask(), only(tokenizer, 7))
    constraint.accept(7)
    assert constraint.complete or constraint.allowed_mask()[sorted(tokenizer.eog_ids)].all()


def test_a_special_token_by_its_text(gbnf, tokenizer):
    (im_start,) = tokenizer.encode("<|im_start|>", add_special=False, parse_special=True)
    constraint = gbnf.compile('root ::= <|im_start|> "x"', tokenizer)()
    assert np.array_equal(constraint.allowed_mask(), only(tokenizer, im_start))


def test_angle_brackets_in_literals_classes_and_comments_are_text(gbnf, tokenizer):
    grammar = 'root ::= "<[42]>" [<>] # then <[7]>\n'
    constraint = gbnf.compile(grammar, tokenizer)()
    for token in tokenizer.encode("<[42]><", add_special=False):
        assert constraint.allowed_mask()[token]
        constraint.accept(token)
    assert not constraint.allowed_mask()[42]


@pytest.mark.parametrize(
    "grammar, words",
    [
        ("root ::= !<|im_start|>", ["!<|im_start|>", "!<[ID]>"]),
        ("root ::= < x", ["'<'", "<[ID]>"]),
        ('root ::= <think> "x"', ["<think>"]),
    ],
    ids=["negated-text", "lone-angle", "not-a-special-token"],
)
def test_token_references_it_cannot_take_are_refused_by_name(gbnf, tokenizer, grammar, words):
    with pytest.raises(ConstraintSpecError) as err:
        gbnf.compile(grammar, tokenizer)()
    assert all(w in str(err.value) for w in words), str(err.value)
