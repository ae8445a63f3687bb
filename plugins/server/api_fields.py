"""Every request field of the server's routes, declared once: type, range, default, meaning.

Handlers read a field through :class:`tessera.plugins.server.fields.Fields`, which checks
it against its declaration here (a 400 naming the field, the value and the allowed range),
and :mod:`tessera.plugins.server.openapi` turns the same declarations into the request
schemas of ``/openapi.json``; so the document and the checks cannot disagree (the
schemathesis test sends both conforming and violating bodies to hold them to it).

Ranges follow llama.cpp's server where it has the field, OpenAI's otherwise; the sampler
ranges are those :class:`tessera.engine.sampling.SamplerParams` checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tessera.engine.sampling import SEED_LIMIT, SamplerParams

_SAMPLER = SamplerParams()


@attrs.frozen
class Field:
    """One request field.

    ``kind`` is one of ``integer``, ``number`` (finite), ``boolean``, ``string``,
    ``strings`` (a string or a list of strings), ``object``, ``choice`` (one of
    ``choices``) or ``any`` (checked by its handler; ``schema`` says which forms it takes).
    ``lo``/``hi`` bound numbers (``lo_open``: strictly above ``lo``).
    """

    name: str
    kind: str
    doc: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] = ()
    required: bool = False
    #: The range is :class:`SamplerParams`' own, checked (and worded) there.
    sampler: bool = False
    schema: Mapping[str, Any] | None = None

    def json_schema(self) -> dict[str, Any]:
        """This field's JSON schema (OpenAPI 3.1)."""
        if self.schema is not None:
            out = dict(self.schema)
        elif self.kind == "strings":
            out = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
        elif self.kind == "choice":
            out = {"type": "string", "enum": list(self.choices)}
        else:
            out = {"type": self.kind}
        if self.lo is not None:
            out["exclusiveMinimum" if self.lo_open else "minimum"] = self.lo
        if self.hi is not None:
            out["maximum"] = self.hi
        if self.default is not None:
            out["default"] = self.default
        # null is accepted for every optional field: it means "not given", as in OpenAI's API
        if not self.required:
            out = {"anyOf": [out, {"type": "null"}]} if "type" in out else _nullable(out)
        return {**out, "description": self.doc}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}


def _group(*fields: Field) -> dict[str, Field]:
    return {f.name: f for f in fields}


_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_TEXT_OR_IDS = {"anyOf": [{"type": "string"}, _TOKEN_IDS]}
_PROMPT = {
    "anyOf": [*_TEXT_OR_IDS["anyOf"], {"type": "array", "items": _TEXT_OR_IDS, "minItems": 1}]
}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        # an array of parts: text parts are joined; image and audio parts are refused
        "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
            "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}]},
    },
}  # fmt: skip


def _sampler(name: str, kind: str, doc: str, lo: float, hi: float | None = None, **kw: Any):
    """A field of :class:`SamplerParams`, with its default."""
    return Field(name, kind, doc, getattr(_SAMPLER, name), lo, hi, sampler=True, **kw)


#: The later stages of the sampler chain (llama-server's names and ranges), on every route
#: that samples except Anthropic's, whose API has none of them
CHAIN = _group(
    _sampler("presence_penalty", "number", "subtracted from each token seen in the last "
             "repeat_last_n; 0 = off", None),
    _sampler("frequency_penalty", "number", "subtracted per time a token was seen in the last "
             "repeat_last_n; 0 = off", None),
    _sampler("typical_p", "number", "locally typical sampling mass; 1 = off", None),
    _sampler("top_n_sigma", "number", "keep logits within n deviations of the best; <= 0 off",
             None),
    _sampler("xtc_probability", "number", "chance that XTC drops the top choices; 0 = off", 0, 1),
    _sampler("xtc_threshold", "number", "XTC drops tokens this likely but the last; > 0.5 off",
             0, 1),
    _sampler("dry_multiplier", "number", "DRY: penalty multiplier * base^(repeat - allowed); "
             "0 = off", 0),
    _sampler("dry_base", "number", "DRY: the penalty's base", 1),
    _sampler("dry_allowed_length", "integer", "DRY: repeats up to this length are free", 0),
    _sampler("dry_penalty_last_n", "integer", "DRY: tokens scanned; 0 off, -1 all", -1),
    _sampler("dry_sequence_breakers", "any", "DRY: strings a repeat may not cross", None,
             schema={"type": "array", "items": {"type": "string"}}),
)  # fmt: skip


MODEL = Field("model", "string", "the model to use (a name from /v1/models); default: the first")

# Output constraints besides response_format (llama-server's and vLLM's names); each is
# compiled by a constraint plugin, and a spec it refuses is a 400 before any work
CONSTRAINTS = _group(
    Field("json_schema", "object", "the output is JSON valid against this schema (llama.cpp)"),
    Field("grammar", "string", "the output matches this GBNF grammar (llama.cpp)"),
    Field("guided_json", "any", "the output is JSON valid against this schema (vLLM)",
          schema={"anyOf": [{"type": "object"}, {"type": "string"}]}),
    Field("guided_regex", "string", "the output matches this regular expression (vLLM)"),
    Field("guided_choice", "any", "the output is exactly one of these strings (vLLM)",
          schema={"type": "array", "items": {"type": "string"}, "minItems": 1}),
    Field("guided_grammar", "string", "the output matches this GBNF grammar (vLLM)"),
)  # fmt: skip

SAMPLING = _group(
    MODEL,
    Field("temperature", "number", "sampling temperature; 0 = greedy", _SAMPLER.temperature, 0, 2),
    _sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    _sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    _sampler("min_p", "number", "drop tokens under min_p x the best; 0 = off", 0, 1),
    _sampler("repeat_penalty", "number", "penalty for recent tokens; 1 = off", 0, lo_open=True),
    _sampler("repeat_last_n", "integer", "recent tokens the penalty sees; 0 off, -1 all", -1),
    # -1 is llama.cpp's "random"; SamplerParams stores it as None
    Field("seed", "integer", "sampling seed; -1 = random", None, -1, SEED_LIMIT - 1, sampler=True),
    Field("max_completion_tokens", "integer", "most tokens to generate", None, 1),
    Field("max_tokens", "integer", "most tokens to generate (older name)", None, 1),
    Field("n_predict", "integer", "most tokens to generate (llama.cpp); -1 = until full", None, -1),
    Field("n", "integer", "choices per prompt", 1, 1, 16),
    Field("stop", "strings", "strings that end the generation (not included in the text)"),
    Field("stream", "boolean", "send server-sent events as tokens come", False),
    Field("stream_options", "object", "{include_usage: bool}: a final usage chunk"),
    Field("id_slot", "integer", "the slot to run in (llama.cpp); -1 = any free slot", -1, -1),
    Field("cache_prompt", "boolean", "reuse the slot's cached prompt prefix", True),
    Field("ignore_eos", "boolean", "keep generating past the end-of-text token", False),
    Field(
        "logit_bias",
        "object",
        "token id -> bias in [-100, 100] added to its logit",
        schema={"type": "object", "additionalProperties": {"type": "number"}},
    ),
    Field(
        "response_format",
        "object",
        "{type: text | json_object | json_schema, json_schema: {name, schema, strict}}",
        schema={
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
                "json_schema": {"type": "object"},
                "schema": {"type": "object"},
            },
        },
    ),
    *CONSTRAINTS.values(),
)

COMPLETIONS = SAMPLING | CHAIN | _group(
    Field("prompt", "any", "a string, token ids, or a list of either", required=True,
          schema=_PROMPT),
    Field("logprobs", "integer", "return this many top log-probabilities per token", None, 0, 20),
    Field("echo", "boolean", "the prompt's text before the completion's", False),
)  # fmt: skip

CHAT = SAMPLING | CHAIN | _group(
    Field(
        "messages", "any", "the conversation: objects with a role and content", required=True,
        schema={"type": "array", "items": _MESSAGE, "minItems": 1},
    ),
    Field("logprobs", "boolean", "return log-probabilities of the output tokens", False),
    Field("top_logprobs", "integer", "alternatives per token with logprobs", 0, 0, 20),
    Field("tools", "any", "functions the model may call",
          schema={"type": "array", "items": {"type": "object"}}),
    Field(
        "tool_choice", "any", "auto, none, required, or {type: function, function: {name}}",
        schema={"anyOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                          {"type": "object", "required": ["function"],
                           "properties": {"function": {"type": "object"}}}]},
    ),
    Field("reasoning_format", "choice", "where reasoning goes: auto/deepseek = reasoning_content",
          "auto", choices=("auto", "deepseek", "none")),
    Field("chat_template_kwargs", "object", "extra variables for the chat template"),
)  # fmt: skip

EMBEDDINGS = _group(
    MODEL,
    Field("input", "any", "a string, token ids, or a list of either", required=True,
          schema=_PROMPT),
    Field("dimensions", "integer", "keep the first dimensions (Matryoshka)", None, 1),
    Field("encoding_format", "choice", "float list or base64 of little-endian float32",
          "float", choices=("float", "base64")),
)  # fmt: skip

_STRING_LIST = {"type": "array", "items": {"type": "string"}}
RERANK = _group(
    MODEL,
    Field("query", "string", "the query", required=True),
    Field("documents", "any", "the documents to rank (Jina's form)", schema=_STRING_LIST),
    Field("texts", "any", "the documents to rank (TEI's form: the answer is a bare list)",
          schema=_STRING_LIST),
    Field("top_n", "integer", "keep the n best; default: all", None, 1),
    Field("return_documents", "boolean", "include each document's text", False),
    Field("return_text", "boolean", "TEI's form: include each text", False),
)  # fmt: skip

TOKENIZE = _group(
    MODEL,
    Field("content", "string", "the text to tokenize", required=True),
    Field("add_special", "boolean", "add BOS/EOS as the model's tokenizer does", False),
    Field("parse_special", "boolean", "read special-token text as special tokens", True),
    Field("with_pieces", "boolean", "return {id, piece} objects", False),
)

DETOKENIZE = _group(
    MODEL,
    Field("tokens", "any", "token ids", schema={"type": "array", "items": {"type": "integer"}}),
)

SLOT_FILE = _group(
    Field("filename", "string", "file name inside --slot-save-path (save and restore)"),
)

# llama-server's native API: /completion, /infill, /embedding (field names and defaults
# of its tools/server/README.md)

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

NATIVE_SAMPLING = {
    **{k: SAMPLING[k] for k in ("model", "top_p", "top_k", "min_p", "repeat_penalty",
                                "repeat_last_n", "seed", "stop", "stream", "id_slot",
                                "cache_prompt", "ignore_eos")},
    **CHAIN,
    **_group(
        _sampler("temperature", "number", "sampling temperature; 0 or below = greedy", None),
        Field("n_predict", "integer", "most tokens to generate; -1 = until the end, 0 = only "
              "read the prompt", -1, -1),
        Field("max_tokens", "integer", "n_predict's other name", None, -1),
        Field("n_probs", "integer", "top log-probabilities per generated token", 0, 0),
        Field("n_cmpl", "integer", "completions per prompt", 1, 1, 16),
        Field("return_tokens", "boolean", "return the generated token ids in 'tokens'", False),
        Field("return_progress", "boolean", "stream prompt_progress while the prompt is read",
              False),
        Field("response_fields", "any", "answer with these fields only ('a/b': a nested one)",
              schema=_STRING_LIST),
        Field("logit_bias", "any", "[[token id or text, bias or false], ...] or {id: bias}",
              schema={"anyOf": [{"type": "array", "items": _BIAS_PAIR}, {"type": "object"}]}),
    ),
    **CONSTRAINTS,
}  # fmt: skip

NATIVE_COMPLETION = NATIVE_SAMPLING | _group(
    Field("prompt", "any", "a string, token ids, a mix of both, {prompt_string}, or a list "
          "of prompts", required=True, schema=_NATIVE_PROMPT),
)  # fmt: skip

INFILL = NATIVE_SAMPLING | _group(
    Field("input_prefix", "any", "the code before the cursor", required=True,
          schema=_TEXT_OR_MIXED),
    Field("input_suffix", "any", "the code after the cursor", required=True,
          schema=_TEXT_OR_MIXED),
    Field("input_extra", "any", "other files as context: [{filename, text}]", schema={
        "type": "array", "items": {"type": "object", "required": ["text"], "properties": {
            "text": {"type": "string"}, "filename": {"type": "string"}}}}),
    Field("prompt", "string", "text already typed at the cursor (continues the prefix)", ""),
)  # fmt: skip

NATIVE_EMBEDDING = _group(
    MODEL,
    Field("content", "any", "the text(s) to embed (llama-server's name)", schema=_NATIVE_PROMPT),
    Field("input", "any", "the text(s) to embed (OpenAI's name)", schema=_NATIVE_PROMPT),
    Field("embd_normalize", "integer", "-1 none, 0 max-abs, 1 taxicab, 2 L2, >2 p-norm; "
          "default: --embd-normalize", None, -1),
)  # fmt: skip

#: POST /props takes no field yet (as llama-server).
PROPS_UPDATE: dict[str, Field] = {}

# Ollama's API (/api/chat, /api/generate, /api/embed ...): its field names and forms;
# keep_alive is not declared (unknown fields are ignored): served models stay loaded

OLLAMA_OPTIONS = _group(
    Field("temperature", "number", "sampling temperature; 0 = greedy", _SAMPLER.temperature, 0, 2),
    _sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    _sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    _sampler("min_p", "number", "drop tokens under min_p x the best; 0 = off", 0, 1),
    _sampler("repeat_penalty", "number", "penalty for recent tokens; 1 = off", 0, lo_open=True),
    _sampler("repeat_last_n", "integer", "recent tokens the penalty sees; 0 off, -1 all", -1),
    Field("seed", "integer", "sampling seed; -1 = random", None, -1, SEED_LIMIT - 1, sampler=True),
    *(CHAIN[k] for k in ("presence_penalty", "frequency_penalty", "typical_p")),
    Field("num_predict", "integer", "most tokens to generate; -1 = until the end", None, -1),
    Field("num_ctx", "integer", "ignored: the context is the server's -c, set at start", None, 1),
    Field("stop", "strings", "strings that end the generation (not included in the text)"),
)  # fmt: skip

_OLLAMA_COMMON = _group(
    Field("model", "string", "the model to use (a name from /api/tags)", required=True),
    Field("stream", "boolean", "NDJSON lines as tokens come; false = one object", True),
    Field("format", "any", "\"json\": the answer is one JSON object; a JSON schema: JSON "
          "valid against it", schema={"anyOf": [{"type": "string", "enum": ["json", ""]},
                                                {"type": "object"}]}),
    Field("options", "object", "sampling options by Ollama's names (temperature, num_predict "
          "...)", schema={"type": "object", "properties": {
              f.name: f.json_schema() for f in OLLAMA_OPTIONS.values()}}),
)  # fmt: skip

OLLAMA_CHAT = _OLLAMA_COMMON | _group(
    Field("messages", "any", "the conversation: objects with a role and content", required=True,
          schema={"type": "array", "items": _MESSAGE, "minItems": 1}),
    Field("tools", "any", "functions the model may call",
          schema={"type": "array", "items": {"type": "object"}}),
)  # fmt: skip

OLLAMA_GENERATE = _OLLAMA_COMMON | _group(
    Field("prompt", "string", "the user's text; empty: only load the model", ""),
    Field("system", "string", "a system message before the prompt"),
    Field("raw", "boolean", "the prompt as it is, without the chat template", False),
)  # fmt: skip

OLLAMA_SHOW = _group(
    Field("model", "string", "the model to describe", required=True),
    Field("verbose", "boolean", "accepted; the metadata is always complete", False),
)

OLLAMA_EMBED = _group(
    Field("model", "string", "the model to use", required=True),
    Field("input", "strings", "the text(s) to embed", required=True),
    Field("truncate", "boolean", "accepted; an input longer than the context is refused (400), "
          "never truncated", True),
    Field("dimensions", "integer", "keep the first dimensions (Matryoshka)", None, 1),
    Field("options", "object", "accepted and ignored (embeddings do not sample)"),
)  # fmt: skip

OLLAMA_EMBEDDINGS = _group(
    Field("model", "string", "the model to use", required=True),
    Field("prompt", "string", "the text to embed", required=True),
    Field("options", "object", "accepted and ignored (embeddings do not sample)"),
)  # fmt: skip

# Anthropic's Messages API (/v1/messages): its field names and ranges

_BLOCK = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
_BLOCKS = {"type": "array", "items": _BLOCK}
_TEXT_BLOCKS = {"anyOf": [{"type": "string"}, _BLOCKS]}
_ANTHROPIC_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": _TEXT_BLOCKS,
    },
}
_ANTHROPIC_TOOL = {
    "type": "object",
    "required": ["name", "input_schema"],
    "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                   "input_schema": {"type": "object"}},
}  # fmt: skip

ANTHROPIC_PROMPT = _group(
    Field("model", "string", "the model to use (a name from /v1/models)", required=True),
    Field("messages", "any", "the conversation: user and assistant turns, text or blocks",
          required=True, schema={"type": "array", "items": _ANTHROPIC_MESSAGE, "minItems": 1}),
    Field("system", "any", "the system prompt: text or text blocks", schema=_TEXT_BLOCKS),
    Field("tools", "any", "tools the model may use: {name, description, input_schema}",
          schema={"type": "array", "items": _ANTHROPIC_TOOL}),
    Field("tool_choice", "any", "{type: auto | any | tool | none, name}", schema={
        "type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
            "name": {"type": "string"}}}),
)  # fmt: skip

ANTHROPIC_MESSAGES = ANTHROPIC_PROMPT | _group(
    Field("max_tokens", "integer", "most tokens to generate", required=True, lo=1),
    Field("stop_sequences", "strings", "strings that end the generation (not in the text)"),
    Field("temperature", "number", "sampling temperature; 0 = greedy", 1.0, 0, 1),
    _sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    _sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    Field("stream", "boolean", "send Anthropic's server-sent events as tokens come", False),
)  # fmt: skip
