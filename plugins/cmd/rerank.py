"""``tessera rerank``: score documents against a query with a reranker model.

Documents come one per line from ``-f FILE``, repeated ``--document`` flags or stdin. The
output is one JSON line per document, ``{"index": i, "score": s}``, in input order, or
highest score first with ``--sort``; ``--top-n`` keeps the best N.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tessera.cli.args import add_model_arguments
from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl
from tessera.plugins.cmd.embed import add_embedding_arguments, embedder_from_args

TESSERA_PLUGIN_API = 2

ACTIVATIONS = ("none", "sigmoid", "softmax")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--query", required=True, help="the query")
    parser.add_argument(
        "--document", action="append", default=None, help="a document (repeat for more)"
    )
    parser.add_argument("-f", "--file", default=None, help="read documents from a file, one a line")
    parser.add_argument("--sort", action="store_true", help="print the best-scoring first")
    parser.add_argument("--top-n", type=int, default=0, help="print only the best N (0 = all)")
    parser.add_argument(
        "--classifier-activation",
        choices=ACTIVATIONS,
        default=None,
        help="applied to the classifier output (default: the model's, else none for one label)",
    )
    add_embedding_arguments(parser)
    add_model_arguments(parser)


def read_documents(args: argparse.Namespace) -> list[str]:
    if args.document:
        docs = list(args.document)
    elif args.file is not None:
        try:
            docs = Path(args.file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TesseraError(f"cannot read document file '{args.file}' ({exc.strerror})") from exc
    else:
        docs = sys.stdin.read().splitlines()
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise TesseraError("no documents; pass --document TEXT, -f FILE or lines on stdin")
    return docs


def run(args: argparse.Namespace, runtime: Any) -> int:
    docs = read_documents(args)
    if args.pooling is None:
        args.pooling = "rank"
    embedder = embedder_from_args(args, runtime, classifier_activation=args.classifier_activation)
    scores = embedder.rerank(args.query, docs)
    if scores.ndim > 1:
        # several labels: the last one is the "relevant" class of two-label cross-encoders
        scores = scores[:, -1]
    order = list(range(len(docs)))
    if args.sort or args.top_n > 0:
        order.sort(key=lambda i: -float(scores[i]))
    if args.top_n > 0:
        order = order[: args.top_n]
    for i in order:
        print(json.dumps({"index": i, "score": float(scores[i]), "document": docs[i]}))
    sys.stdout.flush()
    return 0


@hookimpl
def tessera_register_commands(register):
    register(
        Command("rerank", "score documents against a query with a reranker", add_arguments, run)
    )
