#!/usr/bin/env python3
"""Build the training corpus for tessera's embedded default model.

Everything comes from what a stock CPython install has offline:

* ``pydoc_data.topics.topics`` -- the language-reference topics that
  ``help()`` shows (about 465 KB of text);
* docstrings of the standard library, read with :mod:`ast` straight from the
  ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` (nothing is imported).

Documents are separated by a blank line plus ``<|endoftext|>`` so the trainer
can split them.  The order is deterministic (sorted topics, sorted file paths,
source order inside a file).

Usage::

    python training/build_corpus.py [--out training/out/corpus.txt]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import sys
import sysconfig
from pathlib import Path

EOT = "<|endoftext|>"

# Directory names skipped anywhere below the stdlib root.
SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "ensurepip",
    "turtledemo",
    "venv",
    "config-3",
    "encodings",
    "pydoc_data",
}
# Top-level files that are mostly data or generated noise.
SKIP_FILES = {"this.py", "antigravity.py", "__phello__.foo.py"}

MIN_CHARS = 80  # keep docstrings with at least this much text
MIN_WORDS = 12


def iter_stdlib_files(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        # prune in place, deterministic order
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not d.startswith("config-")
            and not d.startswith(".")
            and not d.startswith("test")
        )
        for name in sorted(filenames):
            if not name.endswith(".py") or name in SKIP_FILES:
                continue
            if name.startswith("test_") or name.startswith("_test"):
                continue
            yield rel / name


def docstrings_of(source: str):
    """Yield (qualname, docstring) in source order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, kinds):
                qual = f"{prefix}{child.name}"
                doc = ast.get_docstring(child, clean=False)
                if doc:
                    yield qual, child, doc
                yield from walk(child, qual + ".")

    mod_doc = ast.get_docstring(tree, clean=False)
    if mod_doc:
        yield "", tree, mod_doc
    yield from walk(tree, "")


def clean(doc: str) -> str:
    doc = inspect.cleandoc(doc)  # dedent + strip leading/trailing blank lines
    lines = [ln.rstrip() for ln in doc.splitlines()]
    # collapse runs of >2 blank lines
    out, blank = [], 0
    for ln in lines:
        blank = blank + 1 if not ln else 0
        if blank <= 1:
            out.append(ln)
    return "\n".join(out).strip()


def good(doc: str) -> bool:
    if len(doc) < MIN_CHARS or len(doc.split()) < MIN_WORDS:
        return False
    letters = sum(c.isalpha() for c in doc)
    if letters / max(1, len(doc)) < 0.5:
        return False
    try:
        doc.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def header_for(modname: str, qual: str, node) -> str:
    if isinstance(node, ast.Module):
        return f"Module {modname}"
    if isinstance(node, ast.ClassDef):
        return f"class {modname}.{qual}"
    try:
        args = ast.unparse(node.args)
    except Exception:  # pragma: no cover - defensive
        args = "..."
    if args.startswith("self, "):
        args = args[len("self, ") :]
    elif args == "self":
        args = ""
    return f"{modname}.{qual}({args})"


def build(out_path: Path) -> dict:
    docs: list[str] = []

    # 1. language reference topics
    from pydoc_data.topics import topics

    n_topics = 0
    for key in sorted(topics):
        text = topics[key].strip()
        if text:
            docs.append(text)
            n_topics += 1
    topic_chars = sum(len(d) for d in docs)

    # 2. stdlib docstrings
    root = Path(sysconfig.get_paths()["stdlib"])
    n_files = n_docs = 0
    seen: set[str] = set()
    for rel in iter_stdlib_files(root):
        try:
            src = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modname = ".".join(parts) or rel.stem
        file_docs = 0
        for qual, node, raw in docstrings_of(src):
            doc = clean(raw)
            if not good(doc) or doc in seen:
                continue
            seen.add(doc)
            docs.append(header_for(modname, qual, node) + "\n\n" + doc)
            file_docs += 1
        if file_docs:
            n_files += 1
            n_docs += file_docs

    text = ("\n\n" + EOT + "\n\n").join(docs) + "\n"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text, encoding="utf-8")
    return {
        "topics": n_topics,
        "topic_chars": topic_chars,
        "stdlib_files": n_files,
        "docstrings": n_docs,
        "chars": len(text),
        "bytes": len(text.encode("utf-8")),
        "python": sys.version.split()[0],
    }


def main() -> None:
    here = Path(__file__).resolve().parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=here / "out" / "corpus.txt")
    args = ap.parse_args()
    stats = build(args.out)
    print(f"wrote {args.out}")
    for k, v in stats.items():
        print(f"  {k}: {v}")
    print(f"corpus size: {stats['bytes'] / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
