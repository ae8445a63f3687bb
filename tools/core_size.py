"""The size of tessera's core: lines per file as ``wc -l`` counts them, and code lines.

A code line holds at least one Python token that is not a comment, and is not part of a
docstring (the string that opens a module, class or function); blank lines count in
neither. core/testing (the conformance kits for plugin authors) is left out, as the
core's size target leaves it out.

    .venv/bin/python tools/core_size.py            # totals, then the largest files
    .venv/bin/python tools/core_size.py --check    # exit 1 if a file is over 300 lines
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 300
_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def core_files(root: Path = ROOT) -> list[Path]:
    """The core's Python files, core/testing excluded."""
    core = root / "core"
    return sorted(p for p in core.rglob("*.py") if (core / "testing") not in p.parents)


def physical_lines(source: str) -> int:
    """Newline characters, as ``wc -l`` counts them."""
    return source.count("\n")


def code_lines(source: str) -> int:
    """Lines with a token of code, docstrings and comments excluded."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - docstrings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"fail on a file over {MAX_LINES}")
    parser.add_argument("--top", type=int, default=10, help="how many of the largest to list")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args(argv)
    sizes = []
    for path in core_files(args.root):
        source = path.read_text(encoding="utf-8")
        sizes.append((physical_lines(source), code_lines(source), path.relative_to(args.root)))
    print(f"core: {len(sizes)} files, {sum(s[0] for s in sizes)} lines (wc -l), ", end="")
    print(f"{sum(s[1] for s in sizes)} code lines (no blank, comment or docstring lines)")
    for lines, code, path in sorted(sizes, reverse=True)[: args.top]:
        print(f"  {lines:5d} {code:5d}  {path}")
    over = [f"{path} has {lines} lines" for lines, _, path in sizes if lines > MAX_LINES]
    if args.check and over:
        print(f"over {MAX_LINES} lines: " + "; ".join(over), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
