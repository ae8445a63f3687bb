"""``tessera perplexity``: perplexity and KL divergence over a text, like llama-perplexity.

``-f TEXT`` is tokenized (with BOS where the vocabulary adds one) and cut into chunks of
``-c`` tokens (default 512); the second half of each chunk is scored
(:mod:`~tessera.plugins.cmd.perplexity_chunks`). The running estimate is printed after each
chunk as ``[1]x.xxxx,[2]...`` and the result as ``Final estimate: PPL = X +/- Y``.

``--kl-divergence-base FILE`` also saves the scored log-probabilities in llama-perplexity's
file format (:mod:`~tessera.plugins.cmd.kld_base`); with ``--kl-divergence`` the file is read
instead, its tokens are evaluated with this model, and the KL divergence from the base,
the perplexity ratio and the token-probability statistics are printed as llama.cpp does.

The compute dtype defaults to f32, as llama.cpp's CPU backend computes, so numbers compare.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tessera.cli.args import add_model_arguments, load_model_from_args
from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl
from tessera.plugins.cmd.perplexity_chunks import (
    ChunkPlan,
    chunk_context,
    plan_chunks,
    scored_logits,
)

TESSERA_PLUGIN_API = 2

#: llama-perplexity's default context: chunks of 512 tokens.
DEFAULT_N_CTX = 512


def chunks_value(text: str) -> int:
    """``--chunks``: -1 (every chunk) or a count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
    if value == 0 or value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (all) or at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--file", default=None, help="text to score (optional with --kl-divergence)"
    )
    parser.add_argument(
        "--chunks",
        type=chunks_value,
        default=-1,
        metavar="N",
        help="score at most N chunks (default: -1, all)",
    )
    parser.add_argument(
        "--kl-divergence-base",
        default=None,
        metavar="FILE",
        help="write the scored log-probabilities to FILE (llama-perplexity's format); "
        "with --kl-divergence, read them from it",
    )
    parser.add_argument(
        "--kl-divergence",
        action="store_true",
        help="KL divergence of this model from the base in --kl-divergence-base",
    )
    add_model_arguments(parser)
    # None: -c not given; the default is 512, or the base file's n_ctx with --kl-divergence
    parser.set_defaults(ctx_size=None)


def read_text(path: str) -> str:
    """The file's text, less one trailing newline (as llama.cpp's -f reads it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TesseraError(f"cannot read text file '{path}' ({exc.strerror})") from exc
    except UnicodeDecodeError as exc:
        raise TesseraError(f"text file '{path}' is not UTF-8 ({exc.reason}); convert it") from exc
    return text[:-1] if text.endswith("\n") else text


def _tokenizer(model: Any) -> Any:
    tok = model.tokenizer
    if tok is None:
        raise TesseraError(f"'{model.path}' has no vocabulary; pass a model file with one")
    if tok.add_eos:
        raise TesseraError(
            "the model's vocabulary appends EOS to every text (tokenizer.ggml.add_eos_token), "
            "which perplexity cannot score, as in llama-perplexity; use a model without it"
        )
    return tok


def _n_ctx(args: argparse.Namespace, model: Any) -> int:
    if args.ctx_size is None:
        n_ctx = DEFAULT_N_CTX
    else:
        n_ctx = args.ctx_size if args.ctx_size > 0 else min(model.n_ctx_train, 4096)
    if n_ctx > model.n_ctx_train:
        print(
            f"warning: the model was trained on only {model.n_ctx_train} context tokens "
            f"({n_ctx} specified)",
            file=sys.stderr,
        )
    return n_ctx


def _info(text: str) -> None:
    print(f"perplexity: {text}", file=sys.stderr, flush=True)


def _evaluate(
    model: Any, args: argparse.Namespace, tokens: Any, plan: ChunkPlan
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield each chunk's index, scored logits and next tokens; say the first pass's time."""
    _info(
        f"calculating over {plan.n_chunk} chunks, n_ctx={plan.n_ctx}, "
        f"batch_size={args.batch_size}, n_seq={plan.n_seq}"
    )
    kv_types = (args.cache_type_k, args.cache_type_v)
    ctx = chunk_context(model, plan, args.ubatch_size, args.flash_attn, *kv_types)
    start = time.perf_counter()
    for index, logits, next_tokens in scored_logits(ctx, tokens, plan):
        if index == 0:
            per_pass = time.perf_counter() - start
            eta = per_pass * plan.n_chunk / plan.n_seq / 60
            _info(f"{per_pass:.2f} seconds per pass - ETA {eta:.2f} minutes")
        yield index, logits, next_tokens


def run_perplexity(args: argparse.Namespace, runtime: Any) -> int:
    from tessera.plugins.cmd.kld_base import KLDBaseWriter, check_output_path
    from tessera.plugins.cmd.perplexity_stats import (
        PerplexityEstimate,
        final_line,
        next_token_nll,
        running_line,
    )

    if args.file is None:
        raise TesseraError("no text to score; pass -f FILE (plain UTF-8 text)")
    text = read_text(args.file)
    if args.kl_divergence_base:
        check_output_path(args.kl_divergence_base)
    model = load_model_from_args(args, runtime)
    tok = _tokenizer(model)
    n_ctx = _n_ctx(args, model)
    tokens = tok.encode(text)
    bos = tok.bos_id if tok.add_bos else None
    plan = plan_chunks(len(tokens), n_ctx, args.batch_size, args.chunks, bos)
    writer = None
    if args.kl_divergence_base:
        writer = KLDBaseWriter(args.kl_divergence_base, n_ctx, model.n_vocab, plan.n_chunk, tokens)
        _info(f"saving the scored log-probabilities to {args.kl_divergence_base}")
    estimate = PerplexityEstimate()
    try:
        for index, logits, next_tokens in _evaluate(model, args, tokens, plan):
            estimate.add(next_token_nll(logits, next_tokens))
            if writer is not None:
                writer.write_chunk(logits)
            print(running_line(index + 1, estimate), end="", flush=True)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if writer is not None:
        writer.close()
    print()
    print(final_line(estimate), flush=True)
    return 0


def _check_base_matches(args: argparse.Namespace, model: Any, base: Any, text: str | None) -> None:
    """One error for a base file that does not belong to this model, -c or text."""
    if base.n_vocab != model.n_vocab:
        raise TesseraError(
            f"'{base.path}' holds log-probabilities over {base.n_vocab} tokens but the model "
            f"has {model.n_vocab}; compare models that share one vocabulary"
        )
    if int(base.tokens.max()) >= model.n_vocab or int(base.tokens.min()) < 0:
        raise TesseraError(
            f"'{base.path}' has token ids outside the model's vocabulary of {model.n_vocab}; "
            "pass the base file of a model with this vocabulary"
        )
    if text is None:
        return
    tokens = _tokenizer(model).encode(text)
    n = base.n_ctx * base.n_chunk
    ours = np.asarray(tokens[:n], dtype=np.int64)
    differ = np.flatnonzero(ours != base.tokens[: len(ours)]).tolist()
    if differ or len(tokens) < n:
        raise TesseraError(
            f"the tokens of '{args.file}' differ from those in '{base.path}' from token "
            f"{differ[0] if differ else len(tokens)} on ({len(tokens)} tokens, the file has "
            f"{n}); pass the text the base was made from, or leave -f out (the base file "
            "holds its tokens)"
        )


def run_kl_divergence(args: argparse.Namespace, runtime: Any) -> int:
    from tessera.plugins.cmd.kld_base import read_kld_base
    from tessera.plugins.cmd.kld_report import (
        CHUNK_HEADER,
        MIN_COUNT_FOR_STATISTICS,
        chunk_line,
        summary_lines,
    )
    from tessera.plugins.cmd.kld_stats import KLDivergence

    base = read_kld_base(args.kl_divergence_base)
    if args.ctx_size is not None and args.ctx_size != base.n_ctx:
        raise TesseraError(
            f"-c {args.ctx_size} differs from the n_ctx {base.n_ctx} of '{base.path}'; leave "
            f"-c out or pass -c {base.n_ctx}"
        )
    text = None if args.file is None else read_text(args.file)
    model = load_model_from_args(args, runtime)
    _check_base_matches(args, model, base, text)
    tok = _tokenizer(model)
    n_chunk = base.n_chunk if args.chunks < 0 else min(args.chunks, base.n_chunk)
    plan = ChunkPlan(
        n_ctx=base.n_ctx,
        n_batch=args.batch_size,
        n_chunk=n_chunk,
        bos_id=tok.bos_id if tok.add_bos else None,
    )
    kld = KLDivergence()
    print(CHUNK_HEADER, flush=True)
    for index, logits, next_tokens in _evaluate(model, args, base.tokens, plan):
        kld.add_chunk(logits, base.chunk_rows(index), next_tokens)
        print(chunk_line(index + 1, kld), flush=True)
    print()
    summary = summary_lines(kld)
    if not summary:
        _info(
            f"{kld.count} scored tokens; the statistics need at least "
            f"{MIN_COUNT_FOR_STATISTICS} (as llama-perplexity): use a longer base text"
        )
    for line in summary:
        print(line)
    sys.stdout.flush()
    return 0


def run(args: argparse.Namespace, runtime: Any) -> int:
    if args.kl_divergence and not args.kl_divergence_base:
        raise TesseraError(
            "--kl-divergence needs --kl-divergence-base FILE: the base model's "
            "log-probabilities, written by a run without --kl-divergence"
        )
    if args.dtype is None:  # llama.cpp's CPU backend computes in f32
        args.dtype = "f32"
    if args.kl_divergence:
        return run_kl_divergence(args, runtime)
    return run_perplexity(args, runtime)


@hookimpl
def tessera_register_commands(register):
    register(
        Command(
            "perplexity",
            "perplexity and KL divergence over a text (like llama-perplexity)",
            add_arguments,
            run,
        )
    )
