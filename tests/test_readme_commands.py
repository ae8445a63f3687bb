"""The README's commands work as written: every ``tessera`` line of its shell blocks parses
with the command line tessera builds (commands and flags that exist, values they accept),
every ``make`` target it names is in the Makefile, and the browser chat it describes comes
up from its own command line: the page, its icon, and a chat answer (the Python API's
greedy answer is the oracle)."""

from __future__ import annotations

import json
import re
import shlex
import urllib.request
from pathlib import Path

import pytest

import tessera
from tessera.cli.main import build_parser
from tessera.plugin_manager import Runtime
from tessera.plugins.server.testing import live_server

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TESSERA = ".venv/bin/tessera"


def _commands(text: str, program: str) -> list[list[str]]:
    """The arguments of every ``program`` command in the shell blocks of ``text`` (a pipe's
    parts each count; comments dropped)."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("|") if "|" in words else len(words)
                if words[0] == program:
                    found.append(words[1:cut])
                words = words[cut + 1 :]
    return found


README_COMMANDS = _commands(README, TESSERA)


def test_the_readme_has_its_commands():
    assert len(README_COMMANDS) >= 20
    assert ["chat"] in README_COMMANDS and ["serve"] in README_COMMANDS


@pytest.mark.parametrize("argv", README_COMMANDS, ids=" ".join)
def test_every_tessera_command_of_the_readme_parses(argv, capsys):
    try:
        args = build_parser(Runtime()).parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"'tessera {' '.join(argv)}' is refused: {capsys.readouterr().err} ({e})")
    assert args.command == argv[0]


def test_every_make_target_of_the_readme_is_in_the_makefile():
    targets = set(re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {argv[0] for argv in _commands(README, "make")}
    assert named and named <= targets, f"the Makefile lacks {sorted(named - targets)}"


def test_the_browser_chat_comes_up_from_the_readmes_command():
    section = README.split("## Chat in the browser", 1)[1].split("\n## ", 1)[0]
    (serve,) = [argv for argv in _commands(section, TESSERA) if argv[0] == "serve"]
    with live_server([*serve[1:], "--backend", "numpy"]) as srv:
        with urllib.request.urlopen(srv.url + "/", timeout=60) as r:
            assert r.status == 200 and 'id="chat-log"' in r.read().decode()
        with urllib.request.urlopen(srv.url + "/favicon.ico", timeout=60) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("image/")
        messages = [{"role": "user", "content": "What is a list?"}]
        body = json.dumps({"messages": messages, "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(
            srv.v1 + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())["choices"][0]["message"]["content"]
    with tessera.LLM(backend="numpy") as llm:
        expected = llm.chat(messages, max_tokens=8, temperature=0)
    assert answer == expected["choices"][0]["message"]["content"]
