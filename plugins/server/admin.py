"""Server routes beside the OpenAI API: /health, /props (GET, and POST with --props;
a router's GET /props without ?model= is its own, see router.py),
/metrics, /tokenize, /detokenize, /v1/models and the slots (/slots, /slots/{id_slot}
?action=...); /slots and /metrics answer 501 when switched off (--no-slots, --no-metrics)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse

from tessera.contract.routes import ApiError
from tessera.engine.slot_files import slot_file_path
from tessera.engine.slot_types import SlotBusyError, SlotNotFoundError
from tessera.errors import TesseraError
from tessera.plugins.server.state import ServerState, engine_problem

from .api_fields_native import DETOKENIZE, PROPS_UPDATE, SLOT_FILE, TOKENIZE
from .fields import Fields, read_json


def _state(request: Request) -> ServerState:
    return request.app.state.tessera


async def health(request: Request) -> Any:
    """200 ``{"status": "ok"}``, or 503 with the reason when an engine is dead or stalled
    (what the watchdog stops the server for)."""
    state = _state(request)
    if state.draining:
        raise ApiError(503, "the server is shutting down")
    problem = engine_problem(state)
    if problem is not None:
        raise ApiError(503, problem)
    return JSONResponse({"status": "ok"})


async def openapi_json(request: Request) -> Any:
    """The OpenAPI document of every listed route (public, like /health)."""
    from tessera import __version__

    from .openapi import document

    state = _state(request)
    return JSONResponse(
        document(request.app.state.routes, __version__, bool(state.settings.api_keys))
    )


async def models(request: Request) -> Any:
    return JSONResponse({"object": "list", "data": _state(request).pool.describe()})


def _default_generation_settings(served: Any) -> dict[str, Any]:
    """llama-server's ``default_generation_settings``: a request's settings when it sets
    none, and the context a slot has."""
    from .native_format import generation_settings

    settings = served.settings
    params = generation_settings(settings.sampler, n_predict=settings.default_n_predict(-1))
    return {"n_ctx": served.engine.ctx.n_ctx, "params": params}


def _endpoint_off(name: str, flag: str) -> ApiError:
    return ApiError(501, f"the {name} endpoint is off on this server; start it without {flag}")


async def props(request: Request) -> Any:
    from tessera import __version__
    from tessera.cli.plugins_cmd import plugins_report

    from .router import router_pool, router_props

    state = _state(request)
    pool = router_pool(state)
    if pool is not None and "model" not in request.query_params:
        return JSONResponse(router_props(pool))
    served = await state.model_for(request)
    ctx = served.engine.ctx
    backend = served.model.backend
    tok = served.tokenizer
    settings = state.settings
    return JSONResponse(
        {
            "default_generation_settings": _default_generation_settings(served),
            "bos_token": tok.token_to_piece(tok.bos_id) if tok.bos_id is not None else "",
            "eos_token": tok.token_to_piece(tok.eos_id) if tok.eos_id is not None else "",
            "modalities": {"vision": False, "audio": False, "video": False},
            "endpoint_slots": settings.endpoint_slots,
            "endpoint_props": settings.endpoint_props,
            "endpoint_metrics": settings.endpoint_metrics,
            "build_info": f"tessera-{__version__}",
            "is_sleeping": False,
            "model_path": served.path,
            "model_alias": served.name,
            "model_identity": served.model.identity,
            "n_ctx": ctx.n_ctx,
            "n_batch": ctx.params.n_batch,
            "n_ubatch": ctx.n_ubatch,
            "total_slots": len(served.engine.slots),
            "backend": backend.name,
            "dtype": backend.dtype,
            "kv_path": ctx.kv_path,
            "kv_path_reason": ctx.kv_path_reason,
            "chat_template": served.chat_template or served.model.chat_template or "",
            "slot_save_path": str(state.settings.slot_save_path or ""),
            "plugins": plugins_report(state.runtime, probe=False)["plugins"],
        }
    )


def _metric(lines: list[str], name: str, value: float, help_text: str, kind: str) -> None:
    lines += [f"# HELP tessera:{name} {help_text}", f"# TYPE tessera:{name} {kind}"]
    lines.append(f"tessera:{name} {value:g}")


async def update_props(request: Request) -> Any:
    """POST /props: ``{"success": true}`` with ``--props`` (no property can be changed yet,
    as in llama-server), else 501."""
    state = _state(request)
    # a body is optional, but one that is sent must be a JSON object
    Fields(await read_json(request) if await request.body() else {}, PROPS_UPDATE)
    if not state.settings.endpoint_props:
        raise ApiError(501, "changing properties is off; start the server with --props")
    return JSONResponse({"success": True})


async def metrics(request: Request) -> Any:
    """Prometheus text exposition of the engine's counters and gauges."""
    state = _state(request)
    if not state.settings.endpoint_metrics:
        raise _endpoint_off("metrics", "--no-metrics")
    served = await state.model_for(request)
    engine, m = served.engine, served.engine.metrics
    kv = engine.ctx.kv
    busy = sum(1 for s in engine.slots if s.task is not None)
    values = {
        "prompt_tokens_total": (m.n_prompt_tokens, "Prompt tokens evaluated.", "counter"),
        "prompt_tokens_cached_total": (
            m.n_prompt_tokens_cached,
            "Prompt tokens reused from a slot's cache.",
            "counter",
        ),
        "tokens_predicted_total": (m.n_tokens_predicted, "Tokens generated.", "counter"),
        "prompt_seconds_total": (m.t_prompt_ms / 1e3, "Prompt processing time.", "counter"),
        "tokens_predicted_seconds_total": (m.t_generate_ms / 1e3, "Generation time.", "counter"),
        "requests_total": (m.requests_total, "Requests accepted.", "counter"),
        "requests_finished_total": (m.requests_finished, "Requests ended.", "counter"),
        "requests_rejected_total": (m.requests_rejected, "Requests refused (busy).", "counter"),
        "n_decode_total": (m.n_decode_calls, "Decode calls.", "counter"),
        "n_batch_rows_total": (m.n_batch_rows, "Batch rows decoded.", "counter"),
        "prompt_store_saved_total": (
            m.n_prompt_store_saved,
            "Slot caches saved before a request overwrote them.",
            "counter",
        ),
        "prompt_store_restored_total": (
            m.n_prompt_store_restored,
            "Saved prompt states restored into a slot.",
            "counter",
        ),
        "requests_processing": (busy, "Requests in a slot now.", "gauge"),
        "requests_deferred": (engine.n_queued, "Requests waiting for a slot.", "gauge"),
        "slots_total": (len(engine.slots), "Slots.", "gauge"),
        "kv_cache_tokens": (kv.n_used, "KV cells in use.", "gauge"),
        "kv_cache_usage_ratio": (kv.n_used / kv.n_ctx, "Share of KV cells in use.", "gauge"),
    }
    if engine.spec is not None:
        values["spec_drafted_total"] = (m.n_drafted, "Tokens drafted.", "counter")
        values["spec_accepted_total"] = (m.n_draft_accepted, "Drafted tokens kept.", "counter")
        rate = m.n_draft_accepted / m.n_drafted if m.n_drafted else 0.0
        values["spec_acceptance_ratio"] = (rate, "Share of drafted tokens kept.", "gauge")
    cache = getattr(getattr(served.model, "experts", None), "cache", None)
    if cache is not None:  # the MoE expert cache (--moe-cache-mib)
        stats = cache.stats()
        for key in ("hits", "misses", "evictions", "bytes_moved"):
            values[f"moe_cache_{key}_total"] = (stats[key], f"Expert cache {key}.", "counter")
        values["moe_cache_bytes_used"] = (stats["bytes_used"], "Expert cache bytes.", "gauge")
        values["moe_cache_hit_ratio"] = (stats["hit_rate"], "Expert cache hit rate.", "gauge")
    for source in state.metric_sources:
        values.update(source())
    lines: list[str] = []
    for name, (value, help_text, kind) in values.items():
        _metric(lines, name, value, help_text, kind)
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


async def tokenize(request: Request) -> Any:
    f = Fields(await read_json(request), TOKENIZE)
    served = await _state(request).model_for(request, f["model"])
    content = f["content"]
    tok = served.tokenizer
    ids = tok.encode(
        content,
        add_special=f["add_special"],
        parse_special=f["parse_special"],
    )
    if f["with_pieces"]:
        return JSONResponse({"tokens": [{"id": t, "piece": tok.token_to_piece(t)} for t in ids]})
    return JSONResponse({"tokens": ids})


async def detokenize(request: Request) -> Any:
    f = Fields(await read_json(request), DETOKENIZE)
    served = await _state(request).model_for(request, f["model"])
    ids = f["tokens"]
    ids = [] if ids is None else ids
    n_vocab = served.tokenizer.n_vocab
    if not isinstance(ids, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in ids
    ):
        raise ApiError(400, f"'tokens' must be a list of token ids in [0, {n_vocab})", "tokens")
    return JSONResponse({"content": served.tokenizer.decode(ids)})


async def slots(request: Request) -> Any:
    """Each slot's state; with ``?fail_on_no_slot=1``, 503 when none is idle."""
    state = _state(request)
    if not state.settings.endpoint_slots:
        raise _endpoint_off("slots", "--no-slots")
    served = await state.model_for(request)
    info = served.engine.slots_info()
    if request.query_params.get("fail_on_no_slot") and all(s["is_processing"] for s in info):
        raise ApiError(503, "no slot is available; retry later")
    return JSONResponse(info)


async def slot_action(request: Request) -> Any:
    state = _state(request)
    try:
        id_slot = int(request.path_params["id_slot"])
    except ValueError:
        raise ApiError(400, "the slot id must be an integer") from None
    action = request.query_params.get("action", "")
    # a body is optional (erase takes none), but one that is sent must be valid
    f = Fields(await read_json(request) if await request.body() else {}, SLOT_FILE)
    engine = (await state.model_for(request)).engine
    try:
        if action == "erase":
            return JSONResponse(engine.erase_slot(id_slot))
        if action not in ("save", "restore"):
            raise ApiError(400, f"unknown slot action {action!r}; use save, restore or erase")
        if state.settings.slot_save_path is None:
            raise ApiError(
                501, "slot save/restore is off; start the server with --slot-save-path DIR"
            )
        filename = f["filename"]
        if filename is None:
            raise ApiError(400, f"'filename' is required to {action} a slot", "filename")
        path = slot_file_path(state.settings.slot_save_path, filename)
        if action == "save":
            return JSONResponse(engine.save_slot(id_slot, path))
        return JSONResponse(engine.restore_slot(id_slot, path))
    except SlotNotFoundError as exc:
        raise ApiError(404, str(exc)) from None
    except SlotBusyError as exc:
        raise ApiError(409, str(exc)) from None
    except TesseraError as exc:
        raise ApiError(400, str(exc)) from None
