"""``tessera run``: generate text from a prompt (like llama.cpp's llama-cli / llama-simple)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tessera.cli.args import (
    add_model_arguments,
    add_sampling_arguments,
    context_from_args,
    context_params_from_args,
    int_at_least,
    load_model_from_args,
    sampler_params_from_args,
)
from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl
from tessera.plugins.cmd.chat import add_conversation_arguments, run_chat
from tessera.plugins.spec.cli import (
    add_spec_arguments,
    default_target,
    spec_params_from_args,
    spec_summary,
    spec_type_from_args,
)
from tessera.plugins.tensor_parallel.launch import SWITCHES as TP_SWITCHES
from tessera.plugins.tensor_parallel.launch import add_tp_arguments, tp_requested

TESSERA_PLUGIN_API = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--prompt", default=None, help="prompt text")
    parser.add_argument(
        "-f", "--file", default=None, help="read the prompt from a file (- for stdin)"
    )
    parser.add_argument(
        "-cnv",
        "--conversation",
        action="store_true",
        help="chat interactively, as tessera chat; -p or -sys is the system message",
    )
    parser.add_argument(
        "-n",
        "--n-predict",
        type=int_at_least(-2, "-1 = until end, -2 = until the context is full"),
        default=128,
        help="tokens to generate (-1 = until end; -2, until the context is full, is the same "
        "here: there is no context shift)",
    )
    parser.add_argument(
        "--chat", action="store_true", help="wrap the prompt in the model's chat template"
    )
    parser.add_argument(
        "-sys", "--system-prompt", default=None, help="system message (with --chat)"
    )
    parser.add_argument(
        "--display-prompt", action="store_true", help="print the prompt before the output"
    )
    parser.add_argument("--no-timings", action="store_true", help="do not print tokens/s to stderr")
    parser.add_argument(
        "--prompt-cache",
        default=None,
        metavar="FILE",
        help="restore the evaluated prompt prefix from FILE and save the prompt's state to it",
    )
    parser.add_argument(
        "--prompt-cache-ro", action="store_true", help="use --prompt-cache but never write it"
    )
    add_conversation_arguments(parser)
    add_model_arguments(parser)
    add_sampling_arguments(parser)
    add_tp_arguments(parser)
    add_spec_arguments(parser)


def _piped_stdin() -> bool:
    """Whether stdin is a pipe or file to read (not a terminal, not absent or closed)."""
    stdin = sys.stdin
    return stdin is not None and not stdin.isatty() and stdin.readable()


def _prompt_text(args: argparse.Namespace) -> str:
    """The prompt: -f FILE, -f - or a pipe on stdin when no -p is given, else -p. Standard
    input is read once; the text is kept in ``args.prompt`` for a second call."""
    if args.file == "-" or (args.file is None and args.prompt is None and _piped_stdin()):
        args.prompt, args.file = sys.stdin.read(), None
        if not args.prompt:
            raise TesseraError("standard input was empty; pipe a prompt or pass -p TEXT")
    if args.file:
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise TesseraError(f"cannot read prompt file '{args.file}' ({exc.strerror})") from exc
    if args.prompt is None:
        raise TesseraError("no prompt given; pass -p TEXT, -f FILE (- for stdin) or pipe it in")
    return args.prompt


def _run_conversation(args: argparse.Namespace, runtime: Any) -> int:
    """``-cnv``: the chat loop; -p / -f give the system message, not a question."""
    if tp_requested(args) or spec_type_from_args(args) is not None or args.prompt_cache:
        raise TesseraError(
            "-cnv runs without --tp, --spec-type and --prompt-cache; drop those flags to chat"
        )
    system = args.system_prompt
    if args.prompt is not None or (args.file not in (None, "-")):
        system = _prompt_text(args)
    return run_chat(args, runtime, system)


def _restore_prompt_cache(path: str | None, ctx: Any, prompt: list[int]) -> int:
    """Load ``path`` into sequence 0 if it exists; return how many prompt tokens it covers.

    The longest common prefix of the saved tokens and ``prompt`` is kept, at most all but
    the last prompt token (its logits are needed to sample).
    """
    if not path or not Path(path).exists():
        return 0
    saved = ctx.load_state(path, 0)
    n_past = 0
    for a, b in zip(saved, prompt[:-1], strict=False):
        if a != b:
            break
        n_past += 1
    print(
        f"prompt cache: reusing {n_past} of {len(prompt)} prompt tokens from '{path}'",
        file=sys.stderr,
    )
    return n_past


def run(args: argparse.Namespace, runtime: Any) -> int:
    if args.conversation:
        return _run_conversation(args, runtime)
    if not tp_requested(args):
        return _run(args, runtime, None)
    from tessera.plugins.tensor_parallel.launch import start

    if args.tp_rank not in (None, 0):
        return start(args, runtime)  # a serving rank: rank 0 has the prompt
    _prompt_text(args)  # a missing prompt is reported before any rank starts
    if args.prompt_cache:
        raise TesseraError("--prompt-cache does not work with --tp yet; drop one of them")
    session = start(args, runtime)
    ok = False
    try:
        code = _run(args, runtime, session)
        ok = True
        return code
    finally:
        session.close(ok)


def _run(args: argparse.Namespace, runtime: Any, session: Any) -> int:
    from tessera.engine.generate import GenerationStats, generate
    from tessera.engine.sampling import Sampler
    from tessera.plugins.cmd.model_summary import model_summary
    from tessera.text.chat_prompt import encode_chat_prompt, model_chat_template
    from tessera.text.stream import StreamDecoder

    text = _prompt_text(args)
    sampler = Sampler(sampler_params_from_args(args))
    spec_type = spec_type_from_args(args)
    if spec_type is not None:
        runtime.spec_decoder(spec_type)  # an unknown type fails before the model loads
        args.model = args.model or default_target(spec_type)
    model = session.model if session else load_model_from_args(args, runtime)
    tok = model.tokenizer
    if tok is None:
        raise TesseraError(f"'{model.path}' has no tokenizer; use a model file with a vocabulary")
    sampler = Sampler(sampler.params.with_vocabulary(tok))  # DRY's breakers as tokens
    if session is not None:
        ctx = session.make_context(context_params_from_args(args, model))
    else:
        ctx = context_from_args(args, model)
    print(model_summary(model, ctx), file=sys.stderr, flush=True)
    if args.chat:
        messages = [{"role": "user", "content": text}]
        if args.system_prompt:
            messages.insert(0, {"role": "system", "content": args.system_prompt})
        text = model_chat_template(tok).render(messages, add_generation_prompt=True)
        prompt = encode_chat_prompt(tok, text)
    else:
        prompt = tok.encode(text, add_special=True, parse_special=False)
    if args.display_prompt:
        sys.stdout.write(text)
    n_past = _restore_prompt_cache(args.prompt_cache, ctx, prompt)
    on_prompt_done = None
    if args.prompt_cache and not args.prompt_cache_ro:

        def on_prompt_done() -> None:  # llama.cpp saves right after prompt processing
            ctx.save_state(args.prompt_cache, 0, prompt)

    stats = GenerationStats()
    decoder = StreamDecoder(tok)
    spec, spec_params = None, None
    if spec_type is not None:
        from tessera.engine.drafting import create_decoder

        spec_params = spec_params_from_args(args)
        spec = create_decoder(runtime, spec_type, ctx, spec_params)

    tokens = generate(
        ctx,
        prompt,
        args.n_predict,
        sampler,
        decoder=spec,
        spec=spec_params,
        eog_ids=tok.eog_ids,
        stats=stats,
        n_past=n_past,
        on_prompt_done=on_prompt_done,
    )
    for token in tokens:
        sys.stdout.write(decoder.feed(token))
        sys.stdout.flush()
    sys.stdout.write(decoder.flush() + "\n")
    wanted = args.n_predict < 0 or stats.n_generated < args.n_predict
    if wanted and len(prompt) + stats.n_generated >= ctx.n_ctx:
        print(
            f"note: generation stopped after {stats.n_generated} tokens because the context "
            f"({ctx.n_ctx} tokens) is full; raise -c for longer output",
            file=sys.stderr,
        )
    if not args.no_timings:
        print(
            f"prompt: {stats.n_prompt} tokens, {stats.prompt_tps:.1f} t/s | "
            f"generation: {stats.n_generated} tokens, {stats.generate_tps:.1f} t/s | "
            f"backend {model.backend.name}/{model.backend.dtype}"
            + (f" | {session.describe}" if session else ""),
            file=sys.stderr,
        )
        if spec_type is not None:
            print(spec_summary(spec_type, stats), file=sys.stderr)
    return 0


@hookimpl
def tessera_register_commands(register):
    register(Command("run", "generate text from a prompt", add_arguments, run))


@hookimpl
def tessera_register_switches(register):
    for switch in TP_SWITCHES:  # tensor parallel runs through this command (--tp)
        register(switch)
