"""The request fields of llama-server's native API: /completion, /infill, /embedding,
/tokenize, /detokenize, /slots, /props and the router's /models routes (field names and
defaults of its tools/server/README.md)."""

from __future__ import annotations

from .api_fields import CHAIN, CONSTRAINTS, MODEL, SAMPLING
from .field_decl import STRING_LIST, Field, group, sampler

TOKENIZE = group(
    MODEL,
    Field("content", "string", "the text to tokenize", required=True),
    Field("add_special", "boolean", "add BOS/EOS as the model's tokenizer does", False),
    Field("parse_special", "boolean", "read special-token text as special tokens", True),
    Field("with_pieces", "boolean", "return {id, piece} objects", False),
)

DETOKENIZE = group(
    MODEL,
    Field("tokens", "any", "token ids", schema={"type": "array", "items": {"type": "integer"}}),
)

SLOT_FILE = group(
    Field("filename", "string", "file name inside --slot-save-path (save and restore)"),
)

_MIXED = {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}
_TEXT_OR_MIXED = {"anyOf": [{"type": "string"}, {**_MIXED, "minItems": 1}]}
_ONE_PROMPT = {
    "anyOf": [
        *_TEXT_OR_MIXED["anyOf"],
        {
            "type": "object",
            "required": ["prompt_string"],
            "properties": {"prompt_string": {"type": "string"}},
        },
    ]
}
_NATIVE_PROMPT = {"anyOf": [*_ONE_PROMPT["anyOf"], {"type": "array", "items": _ONE_PROMPT}]}
_BIAS_PAIR = {
    "type": "array",
    "minItems": 2,
    "maxItems": 2,
    "items": {
        "anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "number"}, {"type": "boolean"}]
    },
}

#: POST /lora-adapters' body: a list of {id, scale} (llama-server's form), not an object
LORA_SCALES = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "scale": {"type": "number"}},
    },
}

NATIVE_SAMPLING = {
    **{k: SAMPLING[k] for k in ("model", "top_p", "top_k", "min_p", "repeat_penalty",
                                "repeat_last_n", "seed", "stop", "stream", "id_slot",
                                "cache_prompt", "ignore_eos")},
    **CHAIN,
    **group(
        sampler("temperature", "number", "sampling temperature; 0 or below = greedy", None),
        Field("n_predict", "integer", "most tokens to generate; -1 = until the end, 0 = only "
              "read the prompt", -1, -1),
        Field("max_tokens", "integer", "n_predict's other name", None, -1),
        Field("n_probs", "integer", "top log-probabilities per generated token", 0, 0),
        Field("n_cmpl", "integer", "completions per prompt", 1, 1, 16),
        Field("return_tokens", "boolean", "return the generated token ids in 'tokens'", False),
        Field("return_progress", "boolean", "stream prompt_progress while the prompt is read",
              False),
        Field("response_fields", "any", "answer with these fields only ('a/b': a nested one)",
              schema=STRING_LIST),
        Field("logit_bias", "any", "[[token id or text, bias or false], ...] or {id: bias}",
              schema={"anyOf": [{"type": "array", "items": _BIAS_PAIR}, {"type": "object"}]}),
        Field("lora", "any", "refused: an adapter's scale (no LoRA adapter is loaded); [] is "
              "accepted", schema=LORA_SCALES),
    ),
    **CONSTRAINTS,
}  # fmt: skip

NATIVE_COMPLETION = NATIVE_SAMPLING | group(
    Field("prompt", "any", "a string, token ids, a mix of both, {prompt_string}, or a list "
          "of prompts", required=True, schema=_NATIVE_PROMPT),
)  # fmt: skip

INFILL = NATIVE_SAMPLING | group(
    Field("input_prefix", "any", "the code before the cursor", required=True,
          schema=_TEXT_OR_MIXED),
    Field("input_suffix", "any", "the code after the cursor", required=True,
          schema=_TEXT_OR_MIXED),
    Field("input_extra", "any", "other files as context: [{filename, text}]", schema={
        "type": "array", "items": {"type": "object", "required": ["text"], "properties": {
            "text": {"type": "string"}, "filename": {"type": "string"}}}}),
    Field("prompt", "string", "text already typed at the cursor (continues the prefix)", ""),
)  # fmt: skip

NATIVE_EMBEDDING = group(
    MODEL,
    Field("content", "any", "the text(s) to embed (llama-server's name)", schema=_NATIVE_PROMPT),
    Field("input", "any", "the text(s) to embed (OpenAI's name)", schema=_NATIVE_PROMPT),
    Field("embd_normalize", "integer", "-1 none, 0 max-abs, 1 taxicab, 2 L2, >2 p-norm; "
          "default: --embd-normalize", None, -1),
)  # fmt: skip

#: POST /props takes no field yet (as llama-server).
PROPS_UPDATE: dict[str, Field] = {}

#: POST /models/load and /models/unload (a router: --models-dir or several -m)
ROUTER_MODEL = group(
    Field("model", "string", "the model to load or unload (an id from GET /models)",
          required=True),
)  # fmt: skip
