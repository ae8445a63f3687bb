"""``tessera embed``: embeddings of text lines (like llama.cpp's llama-embedding).

Reads one input per line from ``-p`` (split at ``--embd-separator``), ``-f FILE`` or
stdin; writes JSON lines (``{"index": i, "embedding": [...]}``) to stdout or ``-o``, or a
float32 ``(n, dims)`` array when ``-o`` ends in ``.npy``. Files are written to a temporary
name and renamed, so a failed run leaves no half-written output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tessera.cli.args import add_model_arguments, load_model_from_args
from tessera.contract.commands import Command
from tessera.engine.pooling import POOLING_TYPES
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


def add_embedding_arguments(parser: argparse.ArgumentParser) -> None:
    """--pooling and --embd-normalize (llama.cpp names), shared with ``tessera rerank``."""
    g = parser.add_argument_group("embeddings")
    g.add_argument(
        "--pooling",
        choices=POOLING_TYPES,
        default=None,
        help="pooling type (default: the model's)",
    )
    g.add_argument(
        "--embd-normalize",
        type=int,
        default=2,
        help="-1 none, 0 max absolute int16, 1 taxicab, 2 euclidean (default), >2 p-norm",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--prompt", default=None, help="inputs, one per line")
    parser.add_argument("-f", "--file", default=None, help="read inputs from a file, one a line")
    parser.add_argument(
        "--embd-separator", default="\n", help="separator between inputs (default: newline)"
    )
    parser.add_argument(
        "--embd-dims",
        type=int,
        default=None,
        metavar="N",
        help="Matryoshka truncation: keep the first N values, then normalize again",
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="write here instead of stdout; a name ending in .npy gets a float32 array",
    )
    add_embedding_arguments(parser)
    add_model_arguments(parser)


def read_inputs(args: argparse.Namespace) -> list[str]:
    """The input texts: from -p, -f or stdin, split at the separator, empty ones dropped."""
    if args.prompt is not None:
        text = args.prompt
    elif args.file is not None:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise TesseraError(f"cannot read input file '{args.file}' ({exc.strerror})") from exc
    else:
        text = sys.stdin.read()
    sep = args.embd_separator.encode().decode("unicode_escape")
    inputs = [t for t in text.split(sep) if t.strip()]
    if not inputs:
        raise TesseraError("no input text; pass -p TEXT, -f FILE or lines on stdin")
    return inputs


def write_atomic(path: str | os.PathLike[str], write: Any) -> None:
    """Call ``write(f)`` on a temporary file next to ``path``, then rename it into place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def embedder_from_args(args: argparse.Namespace, runtime: Any, **options: Any) -> Any:
    """An :class:`tessera.engine.embed.Embedder` for the model and flags; ``options`` are
    passed on (``classifier_activation``)."""
    from tessera.engine.embed import Embedder

    model = load_model_from_args(args, runtime)
    return Embedder(
        model,
        pooling=args.pooling,
        normalize=args.embd_normalize,
        n_ctx=args.ctx_size,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        # -np 1 is the generation default; embedding packs up to 64 inputs per forward
        n_seq_max=args.parallel if args.parallel > 1 else 64,
        kv_types=(args.cache_type_k, args.cache_type_v),
        **options,
    )


def run(args: argparse.Namespace, runtime: Any) -> int:
    inputs = read_inputs(args)
    embedder = embedder_from_args(args, runtime)
    vectors = embedder.embed([embedder.tokenize(t) for t in inputs], dims=args.embd_dims)
    if args.output and args.output.endswith(".npy"):
        write_atomic(args.output, lambda f: np.save(f, vectors))
        print(f"wrote {args.output} ({vectors.shape[0]} x {vectors.shape[1]} float32)")
        return 0
    lines = "".join(
        json.dumps({"index": i, "embedding": [float(x) for x in v]}) + "\n"
        for i, v in enumerate(vectors)
    )
    if args.output:
        write_atomic(args.output, lambda f: f.write(lines.encode()))
    else:
        sys.stdout.write(lines)
        sys.stdout.flush()
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command("embed", "embeddings of text lines (like llama-embedding)", add_arguments, run)
    )
