"""The API coverage tables of docs/server.md: every route of llama-server, Ollama, OpenAI
and Anthropic, and every documented request field, with what tessera does with it.

The field rows are made from the declarations of :mod:`tessera.plugins.server.api_fields`
and its siblings ``api_fields_native``, ``api_fields_ollama`` and ``api_fields_anthropic``
(what the handlers check) plus the documented fields tessera does not declare, with the
reason; a test regenerates the tables and compares them with the document, and compares
the declarations with the live server's ``/openapi.json``, so the three cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import api_fields as af
from . import api_fields_anthropic as anthropic
from . import api_fields_native as native
from . import api_fields_ollama as ollama
from .field_decl import Field

#: Each route that takes a JSON body, and the declarations its handler checks.
ROUTE_FIELDS: tuple[tuple[str, Mapping[str, Field]], ...] = (
    ("POST /v1/chat/completions", af.CHAT),
    ("POST /v1/completions", af.COMPLETIONS),
    ("POST /v1/embeddings", af.EMBEDDINGS),
    ("POST /v1/rerank", af.RERANK),
    ("POST /completion", native.NATIVE_COMPLETION),
    ("POST /infill", native.INFILL),
    ("POST /embedding", native.NATIVE_EMBEDDING),
    ("POST /tokenize", native.TOKENIZE),
    ("POST /detokenize", native.DETOKENIZE),
    ("POST /slots/{id_slot}", native.SLOT_FILE),
    ("POST /models/load", native.ROUTER_MODEL),
    ("POST /models/unload", native.ROUTER_MODEL),
    ("POST /api/chat", ollama.OLLAMA_CHAT),
    ("POST /api/generate", ollama.OLLAMA_GENERATE),
    ("options of /api/chat, /api/generate", ollama.OLLAMA_OPTIONS),
    ("POST /api/show", ollama.OLLAMA_SHOW),
    ("POST /api/embed", ollama.OLLAMA_EMBED),
    ("POST /api/embeddings", ollama.OLLAMA_EMBEDDINGS),
    ("POST /v1/messages", anthropic.ANTHROPIC_MESSAGES),
    ("POST /v1/messages/count_tokens", anthropic.ANTHROPIC_PROMPT),
)

_NO_MIROSTAT = "ignored: Mirostat is not implemented (the default chain samples)"
_NO_DYNATEMP = "ignored: dynamic temperature is not implemented (temperature is fixed)"
_NATIVE_UNDECLARED = {
    "mirostat": _NO_MIROSTAT, "mirostat_tau": _NO_MIROSTAT, "mirostat_eta": _NO_MIROSTAT,
    "dynatemp_range": _NO_DYNATEMP, "dynatemp_exponent": _NO_DYNATEMP,
    "adaptive_target": "ignored: adaptive-p sampling is not implemented",
    "adaptive_decay": "ignored: adaptive-p sampling is not implemented",
    "min_keep": "ignored: every stage keeps at least one token",
    "samplers": "ignored: the chain runs in llama.cpp's default order",
    "n_keep": "ignored: the context never shifts; a prompt longer than it is refused (400)",
    "n_indent": "ignored: no indentation stop",
    "n_cache_reuse": "ignored: the cache reuses a common prefix, not shifted chunks",
    "t_max_predict_ms": "ignored: no time limit; n_predict bounds a generation",
    "timings_per_token": "ignored: timings come with the last chunk",
    "post_sampling_probs": "ignored: n_probs are the model's probabilities before sampling",
    "sse_ping_interval": "ignored: no SSE pings",
    "backend_sampling": "ignored: sampling runs on the CPU",
    "multimodal_data": "ignored: this server has no vision or audio encoder",
}  # fmt: skip
_OPENAI_UNDECLARED = {
    "user": "ignored: no per-user accounting",
    "store": "ignored: nothing is stored", "metadata": "ignored: nothing is stored",
    "parallel_tool_calls": "ignored: the chat format decides how many calls a turn has",
    "service_tier": "ignored: one tier", "prompt_cache_key": "ignored: the cache is by prefix",
    "safety_identifier": "ignored: no per-user accounting",
    "modalities": "ignored: text only", "audio": "ignored: text only",
    "prediction": "ignored: predicted outputs are not implemented (see --spec-type)",
    "web_search_options": "ignored: no web search",
    "functions": "ignored: the deprecated form of tools", "function_call": "ignored: likewise",
    "verbosity": "ignored: no verbosity control",
}  # fmt: skip
_OLLAMA_UNDECLARED = {
    "keep_alive": "ignored: served models stay loaded (least recently used out)",
}
#: Documented fields the handlers do not read, per route, with what happens to them
#: (unknown fields are ignored, as llama-server ignores them).
UNDECLARED: dict[str, dict[str, str]] = {
    "POST /v1/chat/completions": {
        **_OPENAI_UNDECLARED,
        "messages[].content text parts": "supported: joined with a newline into the text",
        "messages[].content image_url, input_audio parts": "refused (400): this model has no "
        "vision or audio encoder",
    },
    "POST /v1/completions": {
        "best_of": "ignored: n choices are drawn, none ranked",
        "suffix": "ignored: use /infill for fill-in-the-middle",
        "user": "ignored: no per-user accounting",
    },
    "POST /v1/embeddings": {"user": "ignored: no per-user accounting"},
    "POST /completion": _NATIVE_UNDECLARED,
    "POST /infill": _NATIVE_UNDECLARED,
    "POST /api/chat": {
        **_OLLAMA_UNDECLARED,
        "messages[].images": "refused (400): this model has no vision encoder",
    },
    "POST /api/generate": {
        **_OLLAMA_UNDECLARED,
        "suffix": "ignored: use /infill for fill-in-the-middle",
        "template": "ignored: the model's chat template (or --chat-template) is used",
        "context": "ignored: the slot's prompt cache plays its part",
        "images": "refused (400): this model has no vision encoder",
    },
    "options of /api/chat, /api/generate": {
        "num_keep": "ignored: the context never shifts",
        "num_batch": "ignored: the server's -b is used",
        "num_gpu": "ignored: placement is the server's",
        "main_gpu": "ignored: placement is the server's",
        "use_mmap": "ignored: the server's loading is used",
        "num_thread": "ignored: the server's -t is used",
    },
    "POST /v1/messages": {
        "messages[].content image blocks": "refused (400): this model has no vision encoder",
        "metadata": "ignored: nothing is stored",
        "service_tier": "ignored: one tier",
    },
}

_SERVED = "supported"
#: Every route of the four APIs: (API, "METHOD /path", status).
ROUTES: tuple[tuple[str, str, str], ...] = (
    ("llama-server", "GET /health", _SERVED),
    ("llama-server", "POST /completion", _SERVED),
    ("llama-server", "POST /completions", _SERVED),
    ("llama-server", "POST /tokenize", _SERVED),
    ("llama-server", "POST /detokenize", _SERVED),
    ("llama-server", "POST /apply-template", _SERVED),
    ("llama-server", "POST /embedding", _SERVED),
    ("llama-server", "POST /embeddings", _SERVED),
    ("llama-server", "POST /reranking", _SERVED),
    ("llama-server", "POST /infill", _SERVED),
    ("llama-server", "GET /props", _SERVED + " (a router's without ?model=: its own props)"),
    ("llama-server", "POST /props", _SERVED + " (with --props; nothing can be changed yet)"),
    ("llama-server", "GET /slots", _SERVED),
    ("llama-server", "POST /slots/{id_slot}", _SERVED + " (save, restore, erase)"),
    ("llama-server", "GET /metrics", _SERVED),
    (
        "llama-server",
        "GET /models",
        _SERVED + " (status unloaded, loading or loaded; failed: "
        "true after a failed load; no args, the models run in the server's process)",
    ),
    ("llama-server", "GET /lora-adapters", _SERVED + " (an empty list: no LoRA adapter is loaded)"),
    (
        "llama-server",
        "POST /lora-adapters",
        _SERVED + " (an empty list; an entry is a 400, as no adapter is loaded)",
    ),
    ("llama-server", "POST /v1/chat/completions/control", "not served: no reasoning control"),
    ("llama-server", "POST /v1/chat/completions/input_tokens", _SERVED),
    (
        "llama-server",
        "POST /models/load",
        _SERVED + " (the answer comes at once; the load runs on, as llama-server's)",
    ),
    (
        "llama-server",
        "POST /models/unload",
        _SERVED + " (409 while the model loads or answers requests)",
    ),
    ("llama-server", "GET /models/sse", "not served: no model events"),
    ("llama-server", "POST /models", "not served: the web UI's Models Manager downloads"),
    ("llama-server", "DELETE /models", "not served: the web UI's Models Manager deletes"),
    ("OpenAI", "GET /v1/models", _SERVED),
    ("OpenAI", "POST /v1/completions", _SERVED),
    ("OpenAI", "POST /v1/chat/completions", _SERVED),
    ("OpenAI", "POST /v1/embeddings", _SERVED),
    ("OpenAI", "POST /v1/responses", "not served: use /v1/chat/completions"),
    ("OpenAI", "POST /v1/audio/transcriptions", "not served: no audio encoder"),
    ("OpenAI", "POST /v1/images/generations", "not served: text models only"),
    ("OpenAI", "POST /v1/moderations", "not served: no moderation model"),
    ("OpenAI", "POST /v1/files", "not served: nothing is stored"),
    ("OpenAI", "POST /v1/batches", "not served: send the requests; slots batch them"),
    ("Jina / TEI", "POST /v1/rerank", _SERVED),
    ("Ollama", "POST /api/chat", _SERVED),
    ("Ollama", "POST /api/generate", _SERVED),
    ("Ollama", "POST /api/embed", _SERVED),
    ("Ollama", "POST /api/embeddings", _SERVED),
    ("Ollama", "GET /api/tags", _SERVED),
    ("Ollama", "GET /api/ps", _SERVED),
    ("Ollama", "POST /api/show", _SERVED),
    ("Ollama", "GET /api/version", _SERVED),
    ("Ollama", "POST /api/pull", "not served: the web UI's Models Manager downloads"),
    ("Ollama", "POST /api/push", "not served: no registry"),
    ("Ollama", "POST /api/create", "not served: model files are made by tessera convert"),
    ("Ollama", "POST /api/copy", "not served: files are served under their names"),
    ("Ollama", "DELETE /api/delete", "not served: the web UI's Models Manager deletes"),
    ("Ollama", "POST /api/blobs/{digest}", "not served: no registry"),
    ("Anthropic", "POST /v1/messages", _SERVED),
    ("Anthropic", "POST /v1/messages/count_tokens", _SERVED),
    ("Anthropic", "POST /v1/messages/batches", "not served: send the requests; slots batch them"),
)


def field_status(field: Field) -> str:
    """``supported``, or the first word of a field that is only accepted, ignored or refused."""
    first = field.doc.split(":")[0].split(";")[0].split(" ")[0]
    return first if first in ("accepted", "ignored", "refused") else "supported"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def routes_table() -> str:
    rows = ["| API | route | tessera |", "|---|---|---|"]
    rows += [f"| {api} | `{route}` | {_cell(status)} |" for api, route, status in ROUTES]
    return "\n".join(rows)


def fields_table() -> str:
    rows = ["| route | field | tessera | meaning |", "|---|---|---|---|"]
    for route, declared in ROUTE_FIELDS:
        for name, field in declared.items():
            rows.append(f"| `{route}` | `{name}` | {field_status(field)} | {_cell(field.doc)} |")
        for name, status in UNDECLARED.get(route, {}).items():
            verdict, _, why = status.partition(": ")
            rows.append(f"| `{route}` | `{name}` | {verdict} | {_cell(why)} |")
    return "\n".join(rows)


#: The markers around each generated table in docs/server.md.
TABLES = {"api-routes": routes_table, "api-fields": fields_table}


def with_tables(text: str) -> str:
    """``text`` (docs/server.md) with each table between its markers made again."""
    for name, make in TABLES.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        head, found, rest = text.partition(start)
        _, found_end, tail = rest.partition(end)
        if not (found and found_end):
            raise ValueError(f"the document lacks the markers {start} ... {end}")
        text = f"{head}{start}\n{make()}\n{end}{tail}"
    return text


def main(argv: list[str] | None = None) -> None:
    """``python -m tessera.plugins.server.api_coverage docs/server.md``: rewrite the tables."""
    import sys
    from pathlib import Path

    path = Path((argv or sys.argv[1:] or ["docs/server.md"])[0])
    path.write_text(with_tables(path.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
