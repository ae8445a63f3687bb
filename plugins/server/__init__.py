"""``tessera serve``: an OpenAI-compatible HTTP server over the slot engine, with
llama-server's native API beside it.

This entry module stays light: the command's flags and the route table are registered
here, and Starlette, uvicorn and the handlers load only when a server starts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import attrs

from tessera.contract.commands import Command
from tessera.contract.routes import ServerRoute, lazy_routes
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


#: (path, module, handler, methods, public)
_ROUTES = [
    ("/health", "admin", "health", ("GET",), True),
    ("/openapi.json", "admin", "openapi_json", ("GET",), True),
    ("/v1/health", "admin", "health", ("GET",), True),
    ("/v1/models", "admin", "models", ("GET",), False),
    ("/models", "admin", "models", ("GET",), False),
    ("/models/load", "router", "models_load", ("POST",), False),
    ("/models/unload", "router", "models_unload", ("POST",), False),
    ("/props", "admin", "props", ("GET",), False),
    ("/props", "admin", "update_props", ("POST",), False),
    ("/metrics", "admin", "metrics", ("GET",), False),
    ("/lora-adapters", "lora_adapters", "lora_adapters", ("GET",), False),
    ("/lora-adapters", "lora_adapters", "set_lora_adapters", ("POST",), False),
    ("/tokenize", "admin", "tokenize", ("POST",), False),
    ("/detokenize", "admin", "detokenize", ("POST",), False),
    ("/slots", "admin", "slots", ("GET",), False),
    ("/slots/{id_slot}", "admin", "slot_action", ("POST",), False),
    ("/v1/completions", "completions", "completions", ("POST",), False),
    # llama-server's native API (/completions is native there too; /v1/completions is OpenAI's)
    ("/completion", "native_completion", "native_completion", ("POST",), False),
    ("/completions", "native_completion", "native_completion", ("POST",), False),
    ("/infill", "infill", "infill", ("POST",), False),
    ("/apply-template", "chat_prompt", "apply_template", ("POST",), False),
    ("/chat/completions/input_tokens", "chat_prompt", "chat_input_tokens", ("POST",), False),
    ("/v1/chat/completions/input_tokens", "chat_prompt", "chat_input_tokens", ("POST",), False),
    ("/embedding", "native_embedding", "native_embedding", ("POST",), False),
    ("/embeddings", "native_embedding", "native_embedding", ("POST",), False),
    ("/reranking", "embeddings", "rerank", ("POST",), False),
    ("/v1/reranking", "embeddings", "rerank", ("POST",), False),
    ("/v1/chat/completions", "chat_completions", "chat_completions", ("POST",), False),
    ("/chat/completions", "chat_completions", "chat_completions", ("POST",), False),
    ("/v1/embeddings", "embeddings", "embeddings", ("POST",), False),
    ("/v1/rerank", "embeddings", "rerank", ("POST",), False),
    ("/rerank", "embeddings", "rerank", ("POST",), False),
    # Ollama's API
    ("/api/chat", "ollama", "ollama_chat", ("POST",), False),
    ("/api/generate", "ollama", "ollama_generate", ("POST",), False),
    ("/api/tags", "ollama_models", "ollama_tags", ("GET",), False),
    ("/api/ps", "ollama_models", "ollama_ps", ("GET",), False),
    ("/api/show", "ollama_models", "ollama_show", ("POST",), False),
    ("/api/embed", "ollama_models", "ollama_embed", ("POST",), False),
    ("/api/embeddings", "ollama_models", "ollama_embeddings", ("POST",), False),
    ("/api/version", "ollama_models", "ollama_version", ("GET",), False),
    # Anthropic's Messages API
    ("/v1/messages", "anthropic_messages", "anthropic_messages", ("POST",), False),
    (
        "/v1/messages/count_tokens",
        "anthropic_messages",
        "anthropic_count_tokens",
        ("POST",),
        False,
    ),
]


@hookimpl
def tessera_register_routes(register: Callable[[ServerRoute], None]) -> None:
    from .openapi import OPERATIONS

    for route in lazy_routes(__name__, _ROUTES):
        register(attrs.evolve(route, openapi=OPERATIONS.get(route.name)))


def _add_arguments(parser: Any) -> None:
    importlib.import_module(f"{__name__}.serve").add_arguments(parser)


def _run(args: Any, runtime: Any) -> int:
    return importlib.import_module(f"{__name__}.serve").run(args, runtime)


@hookimpl
def tessera_register_commands(register: Callable[[Command], None]) -> None:
    register(
        Command(
            name="serve",
            help="OpenAI-compatible server (default http://127.0.0.1:9931)",
            add_arguments=_add_arguments,
            run=_run,
        )
    )
