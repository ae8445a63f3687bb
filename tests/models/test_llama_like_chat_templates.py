"""The llama-like families' chat templates, as llama.cpp's converter stores them, rendered
by tessera exactly as transformers renders them.

Each committed fixture (``tests/data/arch``) carries its family's real template in its
``tokenizer_config.json`` (Mistral Nemo, Ministral 3, SmolLM3, Granite 3.3, OLMo 2,
Phi-3.5 mini, Phi-4-mini, Llama 3.1/3.2; ``tests/data/chat-templates``). tessera reads the
template and the BOS/EOS texts from llama.cpp's GGUF, as ``tessera run --chat`` does; the
oracle is transformers' ``apply_chat_template`` on the HF folder's tokenizer.
"""

from __future__ import annotations

import pytest
import transformers
from llama_like import FIXTURES, TEMPLATE_DIR

from tessera.files.gguf import read_gguf
from tessera.text.chat_template import ChatTemplate
from tessera.text.tokenizer import Tokenizer

SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
USER = {"role": "user", "content": "What is the capital of France?"}
ANSWER = {"role": "assistant", "content": "Paris is."}
FOLLOW_UP = {"role": "user", "content": "And of Italy?"}
CONVERSATIONS = {
    "system-user": ([SYSTEM, USER], True),
    "two-turns": ([USER, ANSWER, FOLLOW_UP], True),
    "system-two-turns": ([SYSTEM, USER, ANSWER, FOLLOW_UP], True),
    "finished": ([USER, ANSWER], False),
}


def tessera_template(name: str) -> ChatTemplate:
    tok = Tokenizer.from_gguf_metadata(read_gguf(FIXTURES[name].gguf).metadata)
    bos = tok.token_to_piece(tok.bos_id) if tok.bos_id is not None else ""
    eos = tok.token_to_piece(tok.eos_id) if tok.eos_id is not None else ""
    return ChatTemplate(tok.chat_template, bos, eos)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("name", FIXTURES)
def test_the_gguf_template_renders_as_transformers_renders_it(name, conversation):
    messages, add_generation_prompt = CONVERSATIONS[conversation]
    hf = transformers.AutoTokenizer.from_pretrained(FIXTURES[name].hf_dir)
    want = hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    got = tessera_template(name).render(messages, add_generation_prompt=add_generation_prompt)
    assert got == want
    assert USER["content"] in got and (conversation != "two-turns" or ANSWER["content"] in got)


@pytest.mark.parametrize("name", FIXTURES)
def test_llama_cpp_stored_the_familys_template(name):
    f = FIXTURES[name]
    stored = read_gguf(f.gguf).metadata["tokenizer.chat_template"]
    assert stored == (TEMPLATE_DIR / f"{f.template}.jinja").read_text()
