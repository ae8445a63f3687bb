"""The request fields of Ollama's API (/api/chat, /api/generate, /api/embed ...): its
field names and forms. keep_alive is not declared (unknown fields are ignored): served
models stay loaded."""

from __future__ import annotations

from tessera.engine.sampling import SEED_LIMIT

from .api_fields import CHAIN
from .field_decl import MESSAGE, SAMPLER, Field, group, sampler

OLLAMA_OPTIONS = group(
    Field("temperature", "number", "sampling temperature; 0 = greedy", SAMPLER.temperature, 0, 2),
    sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    sampler("min_p", "number", "drop tokens under min_p x the best; 0 = off", 0, 1),
    sampler("repeat_penalty", "number", "penalty for recent tokens; 1 = off", 0, lo_open=True),
    sampler("repeat_last_n", "integer", "recent tokens the penalty sees; 0 off, -1 all", -1),
    Field("seed", "integer", "sampling seed; -1 = random", None, -1, SEED_LIMIT - 1, sampler=True),
    *(CHAIN[k] for k in ("presence_penalty", "frequency_penalty", "typical_p")),
    Field("num_predict", "integer", "most tokens to generate; -1 = until the end", None, -1),
    Field("num_ctx", "integer", "ignored: the context is the server's -c, set at start", None, 1),
    Field("stop", "strings", "strings that end the generation (not included in the text)"),
)  # fmt: skip

_OLLAMA_COMMON = group(
    Field("model", "string", "the model to use (a name from /api/tags)", required=True),
    Field("stream", "boolean", "NDJSON lines as tokens come; false = one object", True),
    Field("format", "any", "\"json\": the answer is one JSON object; a JSON schema: JSON "
          "valid against it", schema={"anyOf": [{"type": "string", "enum": ["json", ""]},
                                                {"type": "object"}]}),
    Field("think", "any", "true/false: the chat template's enable_thinking; \"low\", "
          "\"medium\", \"high\": thinking on, with that reasoning_effort",
          schema={"anyOf": [{"type": "boolean"},
                            {"type": "string", "enum": ["low", "medium", "high"]}]}),
    Field("options", "object", "sampling options by Ollama's names (temperature, num_predict "
          "...)", schema={"type": "object", "properties": {
              f.name: f.json_schema() for f in OLLAMA_OPTIONS.values()}}),
)  # fmt: skip

OLLAMA_CHAT = _OLLAMA_COMMON | group(
    Field("messages", "any", "the conversation: objects with a role and content", required=True,
          schema={"type": "array", "items": MESSAGE, "minItems": 1}),
    Field("tools", "any", "functions the model may call",
          schema={"type": "array", "items": {"type": "object"}}),
)  # fmt: skip

OLLAMA_GENERATE = _OLLAMA_COMMON | group(
    Field("prompt", "string", "the user's text; empty: only load the model", ""),
    Field("system", "string", "a system message before the prompt"),
    Field("raw", "boolean", "the prompt as it is, without the chat template", False),
)  # fmt: skip

OLLAMA_SHOW = group(
    Field("model", "string", "the model to describe", required=True),
    Field("verbose", "boolean", "accepted; the metadata is always complete", False),
)

OLLAMA_EMBED = group(
    Field("model", "string", "the model to use", required=True),
    Field("input", "strings", "the text(s) to embed", required=True),
    Field("truncate", "boolean", "accepted; an input longer than the context is refused (400), "
          "never truncated", True),
    Field("dimensions", "integer", "keep the first dimensions (Matryoshka)", None, 1),
    Field("options", "object", "accepted and ignored (embeddings do not sample)"),
)  # fmt: skip

OLLAMA_EMBEDDINGS = group(
    Field("model", "string", "the model to use", required=True),
    Field("prompt", "string", "the text to embed", required=True),
    Field("options", "object", "accepted and ignored (embeddings do not sample)"),
)  # fmt: skip
