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

from tessera.engine.sampling import SEED_LIMIT

from .field_decl import (
    MESSAGE,
    PROMPT,
    SAMPLER,
    STRING_LIST,
    Field,
    group,
    sampler,
)

#: The later stages of the sampler chain (llama-server's names and ranges), on every route
#: that samples except Anthropic's, whose API has none of them
CHAIN = group(
    sampler("presence_penalty", "number", "subtracted from each token seen in the last "
             "repeat_last_n; 0 = off", None),
    sampler("frequency_penalty", "number", "subtracted per time a token was seen in the last "
             "repeat_last_n; 0 = off", None),
    sampler("typical_p", "number", "locally typical sampling mass; 1 = off", None),
    sampler("top_n_sigma", "number", "keep logits within n deviations of the best; <= 0 off",
             None),
    sampler("xtc_probability", "number", "chance that XTC drops the top choices; 0 = off", 0, 1),
    sampler("xtc_threshold", "number", "XTC drops tokens this likely but the last; > 0.5 off",
             0, 1),
    sampler("dry_multiplier", "number", "DRY: penalty multiplier * base^(repeat - allowed); "
             "0 = off", 0),
    sampler("dry_base", "number", "DRY: the penalty's base", 1),
    sampler("dry_allowed_length", "integer", "DRY: repeats up to this length are free", 0),
    sampler("dry_penalty_last_n", "integer", "DRY: tokens scanned; 0 off, -1 all", -1),
    sampler("dry_sequence_breakers", "any", "DRY: strings a repeat may not cross", None,
             schema={"type": "array", "items": {"type": "string"}}),
)  # fmt: skip


MODEL = Field("model", "string", "the model to use (a name from /v1/models); default: the first")

# Output constraints besides response_format (llama-server's and vLLM's names); each is
# compiled by a constraint plugin, and a spec it refuses is a 400 before any work
CONSTRAINTS = group(
    Field("json_schema", "object", "the output is JSON valid against this schema (llama.cpp)"),
    Field("grammar", "string", "the output matches this GBNF grammar (llama.cpp)"),
    Field("guided_json", "any", "the output is JSON valid against this schema (vLLM)",
          schema={"anyOf": [{"type": "object"}, {"type": "string"}]}),
    Field("guided_regex", "string", "the output matches this regular expression (vLLM)"),
    Field("guided_choice", "any", "the output is exactly one of these strings (vLLM)",
          schema={"type": "array", "items": {"type": "string"}, "minItems": 1}),
    Field("guided_grammar", "string", "the output matches this GBNF grammar (vLLM)"),
)  # fmt: skip

SAMPLING = group(
    MODEL,
    Field("temperature", "number", "sampling temperature; 0 = greedy", SAMPLER.temperature, 0, 2),
    sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    sampler("min_p", "number", "drop tokens under min_p x the best; 0 = off", 0, 1),
    sampler("repeat_penalty", "number", "penalty for recent tokens; 1 = off", 0, lo_open=True),
    sampler("repeat_last_n", "integer", "recent tokens the penalty sees; 0 off, -1 all", -1),
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

COMPLETIONS = SAMPLING | CHAIN | group(
    Field("prompt", "any", "a string, token ids, or a list of either", required=True,
          schema=PROMPT),
    Field("logprobs", "integer", "return this many top log-probabilities per token", None, 0, 20),
    Field("echo", "boolean", "the prompt's text before the completion's", False),
)  # fmt: skip

CHAT = SAMPLING | CHAIN | group(
    Field(
        "messages", "any", "the conversation: objects with a role and content", required=True,
        schema={"type": "array", "items": MESSAGE, "minItems": 1},
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
    Field("reasoning_effort", "choice", "none: the chat template's enable_thinking off; a "
          "level: the template's reasoning_effort (over chat_template_kwargs')", None,
          choices=("none", "minimal", "low", "medium", "high", "xhigh", "max")),
)  # fmt: skip

EMBEDDINGS = group(
    MODEL,
    Field("input", "any", "a string, token ids, or a list of either", required=True,
          schema=PROMPT),
    Field("dimensions", "integer", "keep the first dimensions (Matryoshka)", None, 1),
    Field("encoding_format", "choice", "float list or base64 of little-endian float32",
          "float", choices=("float", "base64")),
)  # fmt: skip

RERANK = group(
    MODEL,
    Field("query", "string", "the query", required=True),
    Field("documents", "any", "the documents to rank (Jina's form)", schema=STRING_LIST),
    Field("texts", "any", "the documents to rank (TEI's form: the answer is a bare list)",
          schema=STRING_LIST),
    Field("top_n", "integer", "keep the n best; default: all", None, 1),
    Field("return_documents", "boolean", "include each document's text", False),
    Field("return_text", "boolean", "TEI's form: include each text", False),
)  # fmt: skip
