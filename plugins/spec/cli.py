"""Speculative-decoding flags shared by commands (``tessera run``, later ``serve``).

Flag names follow llama.cpp: ``--spec-type``, ``-md/--model-draft``, ``--draft-max``,
``--draft-min``, ``--draft-p-min``, ``--spec-draft-n-ubatch``.
"""

from __future__ import annotations

import argparse
from typing import Any

from tessera.contract.spec import SpecParams

#: The bundled default model with its trained MTP block (training/train_mtp_head.py).
MTP_VARIANT = "tessera-default-mtp.gguf"


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SpecParams()
    group = parser.add_argument_group("speculative decoding")
    group.add_argument(
        "--spec-type",
        default=None,
        metavar="TYPE",
        help="draft tokens with this spec decoder: draft, mtp, ngram, select, or any "
        "installed one (`tessera plugins` lists them); default: off",
    )
    group.add_argument(
        "-md", "--model-draft", default=None, metavar="FILE", help="draft model (implies draft)"
    )
    group.add_argument(
        "--draft-max",
        "--draft-n",
        type=int,
        default=defaults.draft_max,
        help=f"most tokens drafted per step (default {defaults.draft_max})",
    )
    group.add_argument(
        "--draft-min",
        "--draft-n-min",
        type=int,
        default=defaults.draft_min,
        help="fewer drafted tokens are not verified (default 0)",
    )
    group.add_argument(
        "--draft-p-min",
        type=float,
        default=defaults.p_min,
        help=f"stop drafting below this draft probability (default {defaults.p_min})",
    )
    group.add_argument(
        "--spec-draft-n-ubatch",
        type=int,
        default=None,
        metavar="N",
        help="ubatch size of the draft model's context (default: as -ub)",
    )
    group.add_argument(
        "--no-spec-adaptive",
        action="store_true",
        help="keep the draft length at --draft-max (also TESSERA_SPEC_ADAPTIVE=0)",
    )


def spec_type_from_args(args: argparse.Namespace) -> str | None:
    """The requested spec type; ``-md`` alone means ``draft`` (as in llama.cpp)."""
    return args.spec_type or ("draft" if args.model_draft else None)


def spec_params_from_args(args: argparse.Namespace, backend: str | None = None) -> SpecParams:
    from tessera.errors import TesseraError

    if args.spec_draft_n_ubatch is not None and args.spec_draft_n_ubatch < 1:
        raise TesseraError(
            f"--spec-draft-n-ubatch must be at least 1, got {args.spec_draft_n_ubatch}"
        )
    return SpecParams(
        draft_max=args.draft_max,
        draft_min=args.draft_min,
        p_min=args.draft_p_min,
        model_draft=args.model_draft,
        n_ubatch_draft=args.spec_draft_n_ubatch,
        adaptive=not args.no_spec_adaptive,
        backend=backend,
    )


def default_target(spec_type: str | None) -> str | None:
    """With no ``-m``, ``mtp`` and ``select`` run the bundled default model from its MTP
    variant (the same weights plus the nextn block); other types use the plain file."""
    from tessera.files.load import default_model_path

    path = default_model_path().parent / MTP_VARIANT
    return str(path) if spec_type in ("mtp", "select") and path.exists() else None


def spec_summary(name: str, stats: Any) -> str:
    """One stderr line: llama.cpp's n_drafted / n_accept / accept rate, plus the mean."""
    return (
        f"speculative ({name}): drafted {stats.n_drafted}, accepted {stats.n_accepted} "
        f"({100 * stats.acceptance_rate:.1f}%), mean accepted length "
        f"{stats.mean_accepted:.2f} per target batch, {stats.n_target_batches} target batches"
    )
