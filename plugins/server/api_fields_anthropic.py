"""The request fields of Anthropic's Messages API (/v1/messages and
/v1/messages/count_tokens): its field names and ranges."""

from __future__ import annotations

from .field_decl import Field, group, sampler

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

ANTHROPIC_PROMPT = group(
    Field("model", "string", "the model to use (a name from /v1/models)", required=True),
    Field("messages", "any", "the conversation: user and assistant turns, text or blocks",
          required=True, schema={"type": "array", "items": _ANTHROPIC_MESSAGE, "minItems": 1}),
    Field("system", "any", "the system prompt: text or text blocks", schema=_TEXT_BLOCKS),
    Field("tools", "any", "tools the model may use: {name, description, input_schema}",
          schema={"type": "array", "items": _ANTHROPIC_TOOL}),
    Field("tool_choice", "any", "{type: auto | any | tool | none, name}; any and tool force "
          "a call by constraint", schema={
        "type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
            "name": {"type": "string"}}}),
    Field("thinking", "any", "{type: enabled}: the chat template's enable_thinking on; "
          "{type: disabled}: off (budget_tokens is not enforced)", schema={
        "type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["enabled", "disabled"]},
            "budget_tokens": {"type": "integer"}}}),
)  # fmt: skip

ANTHROPIC_MESSAGES = ANTHROPIC_PROMPT | group(
    Field("max_tokens", "integer", "most tokens to generate", required=True, lo=1),
    Field("stop_sequences", "strings", "strings that end the generation (not in the text)"),
    Field("temperature", "number", "sampling temperature; 0 = greedy", 1.0, 0, 1),
    sampler("top_p", "number", "nucleus sampling mass; 1 = off", 0, 1),
    sampler("top_k", "integer", "keep the k most likely tokens; 0 or below = off", None),
    Field("stream", "boolean", "send Anthropic's server-sent events as tokens come", False),
)  # fmt: skip
