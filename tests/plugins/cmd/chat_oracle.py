"""The answers ``tessera chat`` must give, computed with the engine directly: greedy
generate on a fresh context over the whole conversation rendered by the chat template."""

from __future__ import annotations

import functools

from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.text.chat_template import ChatTemplate


@functools.cache
def default_model():
    return load_model(default_model_path(), Runtime(), "numpy")


def chat_prompt(messages: list[dict]) -> list[int]:
    tok = default_model().tokenizer
    text = ChatTemplate(tok.chat_template).render(messages, add_generation_prompt=True)
    return tok.encode(text, add_special=True, parse_special=True)


def greedy_answer(messages: list[dict], n_predict: int, ignore_eos: bool = False) -> str:
    """The text of the greedy answer to ``messages`` (at most ``n_predict`` tokens)."""
    model = default_model()
    tok = model.tokenizer
    ctx = Context(model, ContextParams(n_ctx=min(model.n_ctx_train, 4096)))
    eog = frozenset() if ignore_eos else tok.eog_ids
    ids = generate(ctx, chat_prompt(messages), n_predict, Sampler(SamplerParams(temperature=0)),
                   eog_ids=eog)  # fmt: skip
    return tok.decode(list(ids))


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}
