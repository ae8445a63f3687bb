"""Chat prompts: the model's template (ChatML when it has none) with its BOS/EOS pieces,
and one BOS, whether or not the template writes it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera.files.gguf import read_gguf
from tessera.files.load import default_model_path
from tessera.text.chat_prompt import encode_chat_prompt, model_chat_template
from tessera.text.chat_template import DEFAULT_CHATML
from tessera.text.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def metadata():
    return dict(read_gguf(default_model_path()).metadata)


def _tokenizer(metadata, **keys):
    return Tokenizer.from_gguf_metadata({**metadata, **keys})


def test_the_models_own_template_else_chatml_else_an_override(metadata):
    tok = _tokenizer(metadata)
    assert model_chat_template(tok).source == tok.chat_template
    bare = dict(metadata)
    bare.pop("tokenizer.chat_template")
    assert model_chat_template(Tokenizer.from_gguf_metadata(bare)).source == DEFAULT_CHATML
    assert model_chat_template(tok, "{{ 'x' }}").render(MESSAGES) == "x"


def test_the_bos_piece_is_the_templates_bos_token(metadata):
    tok = _tokenizer(metadata)
    template = model_chat_template(tok, "{{ bos_token }}|{{ eos_token }}")
    piece = tok.token_to_piece(tok.bos_id)
    assert template.render(MESSAGES) == f"{piece}|{tok.token_to_piece(tok.eos_id)}"


def test_one_bos_whether_or_not_the_template_writes_it(metadata):
    tok = _tokenizer(metadata, **{"tokenizer.ggml.add_bos_token": True})
    bos = tok.token_to_piece(tok.bos_id)
    plain = model_chat_template(tok).render(MESSAGES)
    with_bos = model_chat_template(tok, "{{ bos_token }}" + tok.chat_template).render(MESSAGES)
    assert with_bos == bos + plain
    expected = [tok.bos_id, *tok.encode(plain, add_special=False, parse_special=True)]
    assert encode_chat_prompt(tok, plain) == expected  # the tokenizer adds it
    assert encode_chat_prompt(tok, with_bos) == expected  # the template wrote it: not twice
    assert tok.encode(with_bos, add_special=True, parse_special=True)[:2] == [tok.bos_id] * 2


def test_a_plain_prompt_does_not_import_the_template_engine():
    """``tessera run`` without --chat imports chat_prompt; jinja2 waits for a template."""
    code = "import sys, tessera.text.chat_prompt; print('jinja2' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
