"""The Python API's documentation runs: every example of docs/python-api.md is a doctest
whose output must match, and the README's Python example runs as written."""

from __future__ import annotations

import contextlib
import doctest
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"


def test_every_example_of_the_python_api_page_runs():
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=flags, verbose=False)
    assert result.attempted >= 20, "the page lost its examples"
    assert result.failed == 0, f"{result.failed} example(s) of {PAGE.name} failed (see above)"


def test_the_readme_python_example_runs_as_written():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Chat from Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    from tessera import LLM

    with LLM() as llm:  # the oracle: the same greedy completion, asked directly
        greedy = llm.complete("The for statement", max_tokens=16, temperature=0)
    text = out.getvalue()
    assert text.endswith(greedy["choices"][0]["text"] + "\n")
    assert len(text) > len(greedy["choices"][0]["text"]) + 2  # the chat answers came first
