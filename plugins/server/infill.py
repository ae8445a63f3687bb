"""POST /infill: code infilling with the model's FIM tokens (llama-server's route).

The prompt is laid out by :func:`tessera.plugins.server.fim.infill_prompt` and runs as a
``/completion`` (every option of that route applies; the answer has its shape). A model
without FIM prefix, suffix and middle tokens is refused with one 400 naming the missing
ones.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from tessera.contract.routes import ApiError
from tessera.plugins.server.state import ServedModel, ServerState

from .api_fields_native import INFILL
from .fields import Fields, read_json
from .fim import FimTokens, InfillParts, fim_tokens, infill_prompt
from .native_completion import native_errors, requested_n_predict, run_native
from .native_inputs import mixed_tokens


def model_fim(served: ServedModel) -> FimTokens:
    """The served model's FIM tokens (read once)."""
    fim = served.extras.get("fim_tokens")
    if fim is None:
        fim = fim_tokens(served.model.metadata, served.tokenizer)
        served.extras["fim_tokens"] = fim
    return fim


def _extra(value: Any) -> list[tuple[str, str]]:
    """``input_extra``: ``[{"filename": str (default "tmp"), "text": str}]``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError(
            400, '\'input_extra\' must be a list of {"filename", "text"} objects', "input_extra"
        )
    out = []
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError(
                400, "each 'input_extra' chunk needs a 'text' field with a string", "input_extra"
            )
        filename = chunk.get("filename", "tmp")
        if not isinstance(filename, str):
            raise ApiError(
                400, "an 'input_extra' chunk's 'filename' must be a string", "input_extra"
            )
        out.append((filename, chunk["text"]))
    return out


@native_errors
async def infill(request: Request) -> Any:
    state: ServerState = request.app.state.tessera
    f = Fields(await read_json(request), INFILL)
    served = await state.model_for(request, f["model"])
    fim = model_fim(served)
    if fim.missing():
        # llama-server's answer: 501 not_supported_error
        raise ApiError(
            501,
            f"model '{served.name}' cannot infill: it has no FIM {', '.join(fim.missing())} "
            "token (tokenizer.ggml.fim_*_token_id); serve a code model trained for "
            "fill-in-the-middle",
            "model",
        )
    tok = served.tokenizer
    parts = InfillParts(
        prefix=mixed_tokens(tok, f["input_prefix"], "input_prefix", False, False),
        suffix=mixed_tokens(tok, f["input_suffix"], "input_suffix", False, False),
        prompt=tok.encode(f["prompt"], add_special=False, parse_special=True),
        extra=_extra(f["input_extra"]),
    )
    ctx = served.engine.ctx
    prompt = infill_prompt(
        tok,
        fim,
        parts,
        n_batch=ctx.params.n_batch,
        n_predict=requested_n_predict(f, served.settings.default_n_predict(-1)),
        n_ctx=ctx.n_ctx,
        spm=served.settings.spm_infill,
    )
    return await run_native(request, f, served, [prompt])
