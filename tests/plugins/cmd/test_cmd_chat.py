"""``tessera chat`` in a pseudo-terminal, typed at as a user would: every answer equals the
engine's greedy generate on the whole conversation so far; Ctrl-C stops an answer and the
next question is answered; /save, /load, /clear and /system; the line is edited and recalled
with readline; Ctrl-C twice or Ctrl-D leaves."""

from __future__ import annotations

import json
import os
import sys

import pytest
from chat_oracle import assistant, default_model, greedy_answer, user
from pty_session import PtySession

from tessera.testing.commands import registered_command

Q1, Q2, Q3 = "What is a list?", "And a tuple?", "How do I sort it?"


@pytest.fixture
def chat(tmp_path):
    sessions = []

    def start(*flags: str, command: tuple[str, ...] = ("chat",)) -> PtySession:
        argv = [sys.executable, "-m", "tessera", *command, "--backend", "numpy", "--temp", "0"]
        env = {**os.environ, "TERM": "dumb"}  # no colour or cursor codes from readline
        session = PtySession([*argv, *flags], env, cwd=str(tmp_path))
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.close()


def test_is_registered_through_its_entry_point():
    assert registered_command("tessera.plugins.cmd.chat", "chat").name == "chat"


def test_two_turns_save_clear_and_load(chat, tmp_path):
    s = chat("-n", "12")
    s.expect("> ")
    s.line(Q1)
    a1 = greedy_answer([user(Q1)], 12)
    s.expect(a1 + "\n> ")
    s.line(Q2)
    # the oracle: the engine's greedy generate on the whole two-turn prompt, fresh context
    a2 = greedy_answer([user(Q1), assistant(a1), user(Q2)], 12)
    s.expect(a2 + "\n> ")
    s.line("/save conv.json")
    s.expect("saved 4 messages to conv.json")
    saved = json.loads((tmp_path / "conv.json").read_text(encoding="utf-8"))
    assert saved == {"messages": [user(Q1), assistant(a1), user(Q2), assistant(a2)]}
    s.line("/clear")
    s.expect("conversation cleared")
    s.line(Q2)
    s.expect(greedy_answer([user(Q2)], 12) + "\n> ")  # as if Q2 were the first question
    s.line("/load conv.json")
    s.expect("loaded 4 messages from conv.json")
    s.line(Q3)
    s.expect(greedy_answer([*saved["messages"], user(Q3)], 12) + "\n> ")
    s.send("\x04")  # Ctrl-D
    assert s.wait() == 0


def test_system_then_a_line_edited_and_one_recalled_from_the_history(chat, tmp_path):
    system = {"role": "system", "content": "You are terse."}
    s = chat("-n", "8")
    s.expect("> ")
    s.line("/system You are terse.")
    s.expect("system message set")
    s.expect("> ")
    s.line(Q1[:-2] + "X\x7f" + Q1[-2:])  # a typo, Backspace, the rest: readline edits the line
    a1 = greedy_answer([system, user(Q1)], 8)
    s.expect(a1 + "\n> ")
    s.line("\x1b[A")  # the Up arrow brings the last question back
    a2 = greedy_answer([system, user(Q1), assistant(a1), user(Q1)], 8)
    s.expect(a2 + "\n> ")
    s.line("/save h.json")
    s.expect("saved 5 messages")
    saved = json.loads((tmp_path / "h.json").read_text(encoding="utf-8"))["messages"]
    assert saved == [system, user(Q1), assistant(a1), user(Q1), assistant(a2)]
    s.line("/exit")
    assert s.wait() == 0


# Loaded into the chat process through PYTHONPATH: once the answer's first word is shown the
# stream holds (as a slow model would) until Ctrl-C, however fast this machine is.
_HOLD_AFTER_FIRST_WORD = """
import time
from tessera.text import stream

feed, shown = stream.StreamDecoder.feed, []

def feed_then_hold(self, token):
    piece = feed(self, token)
    if shown is not None:
        shown.append(piece)
        text = "".join(shown).lstrip()
        if any(c.isspace() for c in text):
            globals()["shown"] = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
    return piece

stream.StreamDecoder.feed = feed_then_hold
"""


def test_ctrl_c_stops_the_answer_and_the_next_question_is_answered(chat, tmp_path, monkeypatch):
    hook = tmp_path / "hold"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_AFTER_FIRST_WORD, encoding="utf-8")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    )
    whole = greedy_answer([user(Q1)], 120, ignore_eos=True)
    s = chat("-n", "120", "--ignore-eos")
    s.expect("> ")
    s.line(Q1)
    s.expect(Q1 + "\n")  # the echo of the line typed
    s.expect(whole.split()[0])  # the answer's first word is shown: it is being written
    s.interrupt()
    s.expect("[answer stopped]")
    s.expect("> ")
    s.line("/save cut.json")
    s.expect("saved 2 messages")
    cut = json.loads((tmp_path / "cut.json").read_text(encoding="utf-8"))["messages"][1]
    # what was shown before Ctrl-C stays: a proper beginning of the whole answer
    assert cut["role"] == "assistant" and 0 < len(cut["content"]) < len(whole)
    assert whole.startswith(cut["content"])
    s.line(Q2)
    s.expect(greedy_answer([user(Q1), cut, user(Q2)], 120, ignore_eos=True) + "\n> ")
    s.interrupt()  # at the prompt: a hint, then a second Ctrl-C leaves
    s.expect("Ctrl-C again")
    s.interrupt()
    assert s.wait() == 0


def test_run_conversation_mode_takes_the_prompt_as_the_system_message(chat):
    system = "You are terse."
    s = chat("-cnv", "-p", system, "-n", "10", command=("run",))
    s.expect("> ")
    s.line(Q1)
    s.expect(greedy_answer([{"role": "system", "content": system}, user(Q1)], 10) + "\n> ")
    s.line("/exit")
    assert s.wait() == 0


def test_commands_report_bad_input_and_keep_going(chat, tmp_path):
    (tmp_path / "bad.json").write_text('{"messages": [{"role": "robot"}]}', encoding="utf-8")
    s = chat("-n", "4")
    s.expect("> ")
    for line, message in [
        ("/nope", "error: unknown command '/nope'; /help lists the commands"),
        ("/load missing.json", "error: cannot read 'missing.json'"),
        ("/load bad.json", "error: 'bad.json' holds no list of messages"),
        ("/save", "error: /save needs a file name"),
        ("/save no/such/dir/c.json", "error: cannot save to 'no/such/dir/c.json'"),
        ("/help", "/system TEXT"),
    ]:
        s.line(line)
        s.expect(message)
        s.expect("> ")
    s.line(Q1)
    s.expect(greedy_answer([user(Q1)], 4) + "\n> ")  # nothing above touched the conversation
    s.line("/exit")
    assert s.wait() == 0
    assert default_model().tokenizer is not None
