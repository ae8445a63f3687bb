"""llama-server's input forms, read into token ids: prompts that mix text and token ids,
``{"prompt_string": ...}`` objects, lists of prompts, ``logit_bias`` as pairs, and LoRA
adapter scales (``[{"id", "scale"}]``, of which only the empty list: none is loaded).

The rules are llama-server's: an array holding a number at its top level is one mixed
prompt, any other array is a list of prompts; in a mixed prompt only a string in first
place gets the tokenizer's BOS (``add_special``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from tessera.contract.routes import ApiError


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ids(ids: list[int], n_vocab: int, name: str) -> list[int]:
    bad = next((t for t in ids if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(
            400, f"token id {bad} in '{name}' is outside the vocabulary [0, {n_vocab})", name
        )
    return ids


def mixed_tokens(
    tok: Any, value: Any, name: str, add_special: bool, parse_special: bool
) -> list[int]:
    """One prompt: a string, or a list of strings and token ids, as token ids."""
    if isinstance(value, str):
        return tok.encode(value, add_special=add_special, parse_special=parse_special)
    if not isinstance(value, list) or not all(isinstance(v, str) or _is_id(v) for v in value):
        raise ApiError(400, f"'{name}' must be a string or a list of strings and token ids", name)
    out: list[int] = []
    for i, part in enumerate(value):
        if isinstance(part, str):
            first = add_special and i == 0
            out += tok.encode(part, add_special=first, parse_special=parse_special)
        else:
            out.append(part)
    return _check_ids(out, tok.n_vocab, name)


def _one_prompt(tok: Any, value: Any, name: str) -> list[int]:
    if isinstance(value, dict):
        if value.get("multimodal_data"):
            raise ApiError(
                400, "this server takes no multimodal data; send the prompt text only", name
            )
        text = value.get("prompt_string")
        if not isinstance(text, str):
            raise ApiError(400, f"a '{name}' object needs 'prompt_string', a string", name)
        value = text
    return mixed_tokens(tok, value, name, add_special=True, parse_special=True)


def native_prompts(tok: Any, value: Any, name: str = "prompt") -> list[list[int]]:
    """Every prompt of a ``/completion`` (or ``/embedding``) request, as token ids."""
    if isinstance(value, list) and value and not any(_is_id(v) for v in value):
        return [_one_prompt(tok, v, name) for v in value]
    return [_one_prompt(tok, value, name)]


def native_logit_bias(tok: Any, value: Any) -> tuple[tuple[int, float], ...]:
    """llama-server's ``logit_bias``: ``[[token id or text, bias or false], ...]`` or
    OpenAI's ``{"id": bias}``; a text biases each of its tokens, false bans the token."""
    if value is None:
        return ()
    pairs = list(value.items()) if isinstance(value, dict) else value
    if not isinstance(pairs, list):
        raise ApiError(400, "'logit_bias' must be a list of [token, bias] pairs", "logit_bias")
    out: list[tuple[int, float]] = []
    for pair in pairs:
        if not (isinstance(pair, list | tuple) and len(pair) == 2):
            raise ApiError(
                400, f"logit_bias entry {pair!r} is not a [token, bias] pair", "logit_bias"
            )
        key, bias = pair
        out += [(t, b) for t in _bias_tokens(tok, key) for b in [_bias_value(bias)]]
    return tuple(out)


def _bias_tokens(tok: Any, key: Any) -> list[int]:
    if isinstance(key, str) and key.lstrip("-").isdigit():  # OpenAI's object keys
        key = int(key)
    if _is_id(key):
        return _check_ids([key], tok.n_vocab, "logit_bias")
    if isinstance(key, str):
        return tok.encode(key, add_special=False, parse_special=False)
    raise ApiError(400, f"logit_bias token {key!r} must be a token id or a text", "logit_bias")


def _bias_value(bias: Any) -> float:
    if bias is False:
        return -math.inf  # llama-server: false = never this token
    bad = ApiError(400, f"logit_bias value {bias!r} must be a finite number or false", "logit_bias")
    if isinstance(bias, bool) or not isinstance(bias, int | float):
        raise bad
    try:
        number = float(bias)
    except OverflowError:  # an integer too large for a float
        raise bad from None
    if not math.isfinite(number):
        raise bad
    return max(-100.0, min(100.0, number))


def refuse_lora(value: Any, where: str, param: str | None = None) -> None:
    """llama-server's LoRA scales, ``[{"id", "scale"}, ...]``: only an empty list (or none)
    passes, since this server loads no adapter; an entry is a 400 naming its id."""
    if value is None or value == []:
        return
    if not isinstance(value, list):
        raise ApiError(400, f'{where} must be an array of {{"id", "scale"}} objects', param)
    first = value[0]
    adapter = json.dumps(first.get("id") if isinstance(first, dict) else first)
    raise ApiError(
        400,
        f"no LoRA adapter has id {adapter} ({where}): this server loads none "
        "(GET /lora-adapters lists them); send an empty list",
        param,
    )
