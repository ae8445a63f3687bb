"""Flags and loading shared by the commands that run a model (run, serve, embed, bench ...)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from tessera.contract.experts import MoEOptions
from tessera.engine.context import FLASH_ATTN_MODES, Context, ContextParams
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
        "-c", "--ctx-size", type=int, default=0, help="context size (0 = model's, max 4096)"
    )
    g.add_argument("-b", "--batch-size", type=int, default=2048, help="logical batch size")
    g.add_argument("-ub", "--ubatch-size", type=int, default=512, help="physical batch size")
    g.add_argument("-np", "--parallel", type=int, default=1, help="number of parallel sequences")
    g.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0 = backend default)")
    g.add_argument(
        "-fa",
        "--flash-attn",
        choices=FLASH_ATTN_MODES,
        default="auto",
        help="row-indexed attention over the KV cache (auto: where the backend supports it)",
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


def add_sampling_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    d = SamplerParams()
    g.add_argument("--temp", type=float, default=d.temperature, help="temperature (0 = greedy)")
    g.add_argument("--top-k", type=int, default=d.top_k, help="top-k (0 = off)")
    g.add_argument("--top-p", type=float, default=d.top_p, help="top-p (1 = off)")
    g.add_argument("--min-p", type=float, default=d.min_p, help="min-p (0 = off)")
    g.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty)
    g.add_argument("--repeat-last-n", type=int, default=d.repeat_last_n)
    g.add_argument("-s", "--seed", type=int, default=None, help="RNG seed (default: random)")


def sampler_params_from_args(args: argparse.Namespace) -> SamplerParams:
    return SamplerParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        seed=args.seed,
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
    if args.threads > 0:
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
    )


def context_from_args(args: argparse.Namespace, model: Model) -> Context:
    return Context(model, context_params_from_args(args, model))
