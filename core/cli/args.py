"""Flags and loading shared by the commands that run a model (run, serve, embed, bench ...)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from tessera.contract.experts import MoEOptions
from tessera.engine.context import FLASH_ATTN_MODES, Context, ContextParams
from tessera.engine.kv_types import KV_TYPE_BYTES
from tessera.engine.sampling import SamplerParams
from tessera.errors import TesseraError
from tessera.files.load import Model, default_model_path, load_model

log = logging.getLogger("tessera")


def add_model_arguments(parser: argparse.ArgumentParser, several_models: bool = False) -> None:
    """-m, -c, -b, -ub, -np, -t, -fa and backend selection, named as in llama.cpp.

    ``several_models``: -m may be repeated and ``args.model`` is a list (or None).
    """
    g = parser.add_argument_group("model and context")
    g.add_argument(
        "-m",
        "--model",
        action="append" if several_models else "store",
        help="GGUF file or Hugging Face folder (default: bundled model)"
        + ("; repeat for several models" if several_models else ""),
    )
    g.add_argument(
        "-c",
        "--ctx-size",
        type=int_at_least(0, "0 = the model's"),
        default=0,
        help="context size (0 = model's, max 4096)",
    )
    g.add_argument(
        "-b", "--batch-size", type=int_at_least(1), default=2048, help="logical batch size"
    )
    g.add_argument(
        "-ub", "--ubatch-size", type=int_at_least(1), default=512, help="physical batch size"
    )
    g.add_argument(
        "-np", "--parallel", type=int_at_least(1), default=1, help="number of parallel sequences"
    )
    # the default 0 leaves the backend's own count; a given -t must be a real count
    g.add_argument(
        "-t", "--threads", type=int_at_least(1), default=0, help="CPU threads (default: backend's)"
    )
    g.add_argument(
        "-fa",
        "--flash-attn",
        choices=FLASH_ATTN_MODES,
        default="auto",
        help="row-indexed attention over the KV cache (auto: where the backend supports it)",
    )
    for part in ("k", "v"):  # llama.cpp's -ctk / -ctv
        g.add_argument(
            f"-ct{part}",
            f"--cache-type-{part}",
            type=str.lower,
            choices=tuple(KV_TYPE_BYTES),
            default="",
            help=f"storage type of the {part.upper()} cache (default: the compute dtype)",
        )
    g.add_argument(
        "--backend", default=None, help="backend plugin to use (default: best available)"
    )
    g.add_argument("--device", default=None, help="device, e.g. cpu or cuda:0")
    g.add_argument("--dtype", default=None, choices=["f32", "bf16", "f16"], help="compute dtype")
    g.add_argument(
        "--no-prune",
        action="store_true",
        help="run every prompt row through the KV-shared layers (no prefill pruning)",
    )
    add_moe_arguments(parser)


def add_moe_arguments(parser: argparse.ArgumentParser) -> None:
    """Expert placement of mixture-of-experts models (llama.cpp's flag names)."""
    g = parser.add_argument_group("mixture of experts")
    g.add_argument(
        "--cpu-moe", action="store_true", help="keep every MoE layer's experts in the slow tier"
    )
    g.add_argument(
        "-ncmoe",
        "--n-cpu-moe",
        type=int,
        default=0,
        metavar="N",
        help="keep the experts of the first N MoE layers in the slow tier",
    )
    g.add_argument(
        "--moe-cache-mib",
        type=float,
        default=0.0,
        metavar="N",
        help="expert cache for offloaded experts, in MiB (0 = off)",
    )
    g.add_argument(
        "--moe-cache-shared",
        action="store_true",
        help="one expert cache for every model and backend of the process",
    )


def moe_options_from_args(args: argparse.Namespace) -> MoEOptions:
    """:class:`MoEOptions` from the flags (defaults where a command lacks them)."""
    try:
        return MoEOptions(
            cache_mib=getattr(args, "moe_cache_mib", 0.0),
            shared=getattr(args, "moe_cache_shared", False),
            n_cpu_moe=getattr(args, "n_cpu_moe", 0),
            cpu_moe=getattr(args, "cpu_moe", False),
        )
    except ValueError as exc:
        raise TesseraError(
            "--moe-cache-mib and -ncmoe take a number >= 0; pass 0 to turn them off"
        ) from exc


def int_at_least(low: int, note: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``, refused at parse time (before any model
    loads) with a message naming the value and the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if value < low:
            extra = f" ({note})" if note else ""
            raise argparse.ArgumentTypeError(f"must be at least {low}{extra}, got {value}")
        return value

    return parse


def sampler_value(field: str, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` for a :class:`SamplerParams` field: ``kind(text)`` checked by the
    field's own validator (NaN, out of range, a seed below -1 are refused at parse time)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'") from None
        try:
            return getattr(SamplerParams(**{field: value}), field)
        except TesseraError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    d = SamplerParams()

    def flag(*names: str, field: str, kind: Callable[[str], Any], help: str) -> None:
        default = getattr(d, field)
        g.add_argument(*names, type=sampler_value(field, kind), default=default, help=help)

    flag("--temp", field="temperature", kind=float, help="temperature (0 = greedy)")
    flag("--top-k", field="top_k", kind=int, help="top-k (0 or below = off)")
    flag("--top-p", field="top_p", kind=float, help="top-p (1 = off)")
    flag("--min-p", field="min_p", kind=float, help="min-p (0 = off)")
    flag("--repeat-penalty", field="repeat_penalty", kind=float, help="> 0 (1 = off)")
    flag(
        "--repeat-last-n",
        field="repeat_last_n",
        kind=int,
        help="tokens penalized (0 = off, -1 = the whole context)",
    )
    flag("--presence-penalty", field="presence_penalty", kind=float, help="0 = off")
    flag("--frequency-penalty", field="frequency_penalty", kind=float, help="0 = off")
    flag("--typical", field="typical_p", kind=float, help="locally typical sampling (1 = off)")
    flag("--top-n-sigma", field="top_n_sigma", kind=float, help="0 or below = off")
    flag("--xtc-probability", field="xtc_probability", kind=float, help="0 = off")
    flag("--xtc-threshold", field="xtc_threshold", kind=float, help="above 0.5 = off")
    flag("--dry-multiplier", field="dry_multiplier", kind=float, help="0 = off")
    flag("--dry-base", field="dry_base", kind=float, help=">= 1")
    flag("--dry-allowed-length", field="dry_allowed_length", kind=int, help="free repeat length")
    flag(
        "--dry-penalty-last-n",
        field="dry_penalty_last_n",
        kind=int,
        help="tokens DRY scans (0 = off, -1 = the whole context)",
    )
    flag("-s", "--seed", field="seed", kind=int, help="RNG seed (default, -1: random)")


#: SamplerParams field -> the argparse dest of its flag (the rest share the field's name).
_SAMPLER_DESTS = {"temperature": "temp", "typical_p": "typical"}
_SAMPLER_FLAG_FIELDS = (
    "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "typical_p", "top_n_sigma", "xtc_probability",
    "xtc_threshold", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "seed",
)  # fmt: skip


def sampler_params_from_args(args: argparse.Namespace) -> SamplerParams:
    return SamplerParams(
        **{f: getattr(args, _SAMPLER_DESTS.get(f, f)) for f in _SAMPLER_FLAG_FIELDS}
    )


def load_model_from_args(args: argparse.Namespace, runtime: Any) -> Model:
    path = args.model or default_model_path()
    model = load_model(
        path,
        runtime,
        args.backend,
        progress=True,
        device=args.device,
        dtype=args.dtype,
        moe=moe_options_from_args(args),
    )
    backend = model.backend
    if args.threads > 0:  # 0: the flag was not given
        backend.set_threads(args.threads)
    log.info(
        "loaded %s (%s) on %s/%s",
        path,
        model.config.__class__.__name__,
        backend.name,
        backend.dtype,
    )
    return model


def context_params_from_args(args: argparse.Namespace, model: Model) -> ContextParams:
    n_ctx = args.ctx_size if args.ctx_size > 0 else min(model.n_ctx_train, 4096)
    return ContextParams(
        n_ctx=n_ctx,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        n_seq_max=args.parallel,
        flash_attn=args.flash_attn,
        kv_unified=getattr(args, "kv_unified", True),
        prune=not getattr(args, "no_prune", False),
        type_k=getattr(args, "cache_type_k", ""),
        type_v=getattr(args, "cache_type_v", ""),
    )


def context_from_args(args: argparse.Namespace, model: Model) -> Context:
    return Context(model, context_params_from_args(args, model))
