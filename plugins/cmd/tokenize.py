"""``tessera tokenize``: how a model's tokenizer splits a text (like llama.cpp's llama-tokenize)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera.contract.commands import Command
from tessera.hookspecs import hookimpl

TESSERA_PLUGIN_API = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-m",
        "--model",
        default=None,
        help="GGUF file (vocab-only files work) or Hugging Face folder (default: bundled model)",
    )
    parser.add_argument("text", help="the text to tokenize")
    parser.add_argument(
        "--ids", action="store_true", help="print only the list of ids, like [1, 15043, 3186]"
    )
    parser.add_argument(
        "--no-bos", action="store_true", help="do not add the BOS/EOS tokens the model asks for"
    )
    parser.add_argument(
        "--parse-special",
        action="store_true",
        help="turn control tokens written in the text (<|im_start|>) into ids",
    )
    parser.add_argument(
        "--show-count", action="store_true", help="print the number of tokens at the end"
    )


def run(args: argparse.Namespace, runtime: Any) -> int:
    from tessera.text.tokenizer import Tokenizer

    if args.model is None:
        from tessera.files.load import default_model_path

        args.model = default_model_path()
    tok = Tokenizer.from_path(args.model, runtime)
    ids = tok.encode(args.text, add_special=not args.no_bos, parse_special=args.parse_special)
    if args.ids:
        print(ids)
    else:
        for token_id in ids:
            print(f"{token_id:6d} -> '{tok.token_to_piece(token_id)}'")
    if args.show_count:
        print(f"Total number of tokens: {len(ids)}")
    sys.stdout.flush()
    return 0


@hookimpl
def tessera_register_commands(register):
    register(Command("tokenize", "show the token ids of a text", add_arguments, run))
