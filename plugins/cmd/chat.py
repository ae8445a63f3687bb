"""``tessera chat`` (and ``tessera run -cnv``): an interactive chat in the terminal, like
llama-cli's conversation mode.

The flags are ``run``'s model, context and sampling flags, ``-n`` per answer (default -1:
until the model ends its turn or the context is full), ``-sys`` for the system message,
``--ignore-eos`` and ``--load FILE`` to start from a saved conversation. On a terminal the
line is edited with readline (history with the arrow keys); from a pipe or ``-f FILE``
(``-f -``: standard input), each line is a question and no prompt is drawn. See
:mod:`tessera.plugins.cmd.chat_repl` for the loop.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera.cli.args import (
    add_model_arguments,
    add_sampling_arguments,
    context_from_args,
    int_at_least,
    load_model_from_args,
    sampler_params_from_args,
)
from tessera.contract.commands import Command
from tessera.errors import TesseraError
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--n-predict",
        type=int_at_least(-2, "-1 = until the turn ends"),
        default=-1,
        help="most tokens per answer (-1 = until the model ends its turn or the context is full)",
    )
    parser.add_argument("-sys", "--system-prompt", default=None, help="system message")
    parser.add_argument(
        "-f",
        "--file",
        default=None,
        metavar="FILE",
        help="read the questions from FILE, one per line (- for stdin, as a pipe)",
    )
    add_conversation_arguments(parser)
    add_model_arguments(parser)
    add_sampling_arguments(parser)


def add_conversation_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of conversation mode beyond ``run``'s (``tessera run -cnv`` takes them too)."""
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-turn tokens"
    )
    parser.add_argument(
        "--load", default=None, metavar="FILE", help="start from a conversation /save wrote"
    )


def _line_reader(interactive: bool) -> Any:
    """``input``; on a terminal with readline loaded, so the line can be edited, and
    made to take a Ctrl-C however soon after the prompt it comes."""
    if not interactive:
        return input
    try:
        import readline  # noqa: F401  (importing it gives input() line editing)
    except ImportError:  # Windows without pyreadline: plain input
        pass
    from tessera.plugins.cmd.chat_input import interruptible_input

    return interruptible_input


def _file_reader(path: str) -> Any:
    """``input`` over the lines of ``path`` (read now, so a missing file fails before the
    model loads): each call gives the next line, then EOFError, as at the end of a pipe."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = iter(f.read().splitlines())
    except OSError as exc:
        raise TesseraError(f"cannot read questions file '{path}' ({exc.strerror})") from exc

    def read_line(prompt: str = "") -> str:
        line = next(lines, None)
        if line is None:
            raise EOFError
        return line

    return read_line


def run_chat(
    args: argparse.Namespace,
    runtime: Any,
    system: str | None = None,
    questions: str | None = None,
) -> int:
    """Load the model and run the chat loop; ``system`` (else ``-sys``) is the system
    message; ``questions`` a file of questions (``-``: standard input, as a pipe)."""
    from tessera.engine.sampling import Sampler
    from tessera.plugins.cmd.chat_conversation import Conversation
    from tessera.plugins.cmd.chat_repl import ChatRepl
    from tessera.plugins.cmd.model_summary import model_summary

    sampler = Sampler(sampler_params_from_args(args))
    from_file = _file_reader(questions) if questions not in (None, "-") else None
    conversation = Conversation.load(args.load) if getattr(args, "load", None) else Conversation()
    if system or args.system_prompt:
        conversation.system = system or args.system_prompt
    model = load_model_from_args(args, runtime)
    if model.tokenizer is None:
        raise TesseraError(f"'{model.path}' has no tokenizer; chat with a model that has one")
    sampler = Sampler(sampler.params.with_vocabulary(model.tokenizer))  # DRY's breakers as tokens
    ctx = context_from_args(args, model)
    print(model_summary(model, ctx), file=sys.stderr, flush=True)
    interactive = questions is None and sys.stdin is not None and sys.stdin.isatty()
    if interactive:
        print(
            "chat: /help lists the commands; Ctrl-C stops an answer, Ctrl-D or /exit leaves",
            file=sys.stderr,
            flush=True,
        )
    repl = ChatRepl(
        ctx,
        sampler,
        args.n_predict,
        conversation,
        ignore_eos=getattr(args, "ignore_eos", False),
        read_line=from_file or _line_reader(interactive),
        prompt="> " if interactive else "",
        out=sys.stdout,
        err=sys.stderr,
    )
    return repl.run()


def run(args: argparse.Namespace, runtime: Any) -> int:
    return run_chat(args, runtime, questions=args.file)


@hookimpl
def tessera_register_commands(register):
    register(
        Command(
            "chat", "chat with a model in the terminal (like llama-cli -cnv)", add_arguments, run
        )
    )
