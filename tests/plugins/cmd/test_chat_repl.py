"""The chat loop in-process: only the new turn is evaluated, the answers equal the engine's
greedy generate on the whole conversation, a question too long for the context is refused
and forgotten, and questions can come from a pipe."""

from __future__ import annotations

import io
import sys

from chat_oracle import assistant, chat_prompt, default_model, greedy_answer, user

from tessera.cli.main import main
from tessera.engine.cached_sequence import common_prefix
from tessera.engine.context import Context, ContextParams
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.plugins.cmd.chat_conversation import Conversation
from tessera.plugins.cmd.chat_repl import ChatRepl
from tessera.text.chat_template import ChatTemplate


def _repl(lines, n_predict=8, n_ctx=512):
    feed = iter(lines)

    def read_line(prompt):
        try:
            item = next(feed)
        except StopIteration:
            raise EOFError from None
        if isinstance(item, BaseException):  # a key the test presses at the prompt
            raise item
        return item

    ctx = Context(default_model(), ContextParams(n_ctx=n_ctx))
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(ctx, Sampler(SamplerParams(temperature=0)), n_predict, Conversation(),
                    read_line=read_line, out=out, err=err)  # fmt: skip
    return repl, out, err


def test_the_second_turn_evaluates_only_what_follows_the_cached_conversation():
    repl, out, _ = _repl([])
    repl.answer("What is a list?")
    cached = list(repl.seq.tokens)
    a1 = repl.conversation.turns[-1]["content"]
    assert a1 == greedy_answer([user("What is a list?")], 8)
    repl.answer("And a tuple?")
    full = chat_prompt([user("What is a list?"), assistant(a1), user("And a tuple?")])
    reused = common_prefix(cached, full)
    # the first turn's prompt is kept, but for its last token where its text runs into the
    # answer's ("\n" + "\n\n" re-tokenizes as one "\n\n\n"), and the answer from there on
    assert reused >= len(chat_prompt([user("What is a list?")])) - 1
    assert repl.last_stats.n_prompt == len(full) - reused < len(full)
    a2 = greedy_answer([user("What is a list?"), assistant(a1), user("And a tuple?")], 8)
    assert repl.conversation.turns[-1]["content"] == a2
    assert out.getvalue() == a1 + "\n" + a2 + "\n"


def test_a_question_too_long_for_the_context_is_refused_and_forgotten():
    repl, out, err = _repl(["word " * 80, "/exit"], n_ctx=64)
    assert repl.run() == 0
    assert "error: the prompt has" in err.getvalue() and "/clear" in err.getvalue()
    assert repl.conversation.turns == [] and out.getvalue() == ""


def test_system_sets_and_removes_the_system_message():
    repl, _, err = _repl(["/system Be brief.", "Hi", "/system", "/exit"])
    assert repl.run() == 0
    assert repl.conversation.system is None
    assert "system message set" in err.getvalue() and "system message removed" in err.getvalue()
    first = repl.conversation.turns[1]["content"]
    assert first == greedy_answer([{"role": "system", "content": "Be brief."}, user("Hi")], 8)


def test_questions_from_a_pipe_are_answered_in_turn(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO("What is a list?\nAnd a tuple?\n"))
    code = main(["chat", "--backend", "numpy", "--temp", "0", "-n", "8"])
    out = capsys.readouterr().out
    a1 = greedy_answer([user("What is a list?")], 8)
    a2 = greedy_answer([user("What is a list?"), assistant(a1), user("And a tuple?")], 8)
    assert code == 0 and out == a1 + "\n" + a2 + "\n\n"  # no prompt drawn into a pipe


def test_load_flag_starts_from_a_saved_conversation(tmp_path, monkeypatch, capsys):
    saved = Conversation("Be brief.", [user("What is a list?"), assistant("A sequence.")])
    saved.save(tmp_path / "c.json")
    monkeypatch.setattr(sys, "stdin", io.StringIO("And a tuple?\n"))
    argv = [
        "chat",
        "--backend",
        "numpy",
        "--temp",
        "0",
        "-n",
        "8",
        "--load",
        str(tmp_path / "c.json"),
    ]
    assert main(argv) == 0
    expected = greedy_answer([*saved.messages(), user("And a tuple?")], 8)
    assert capsys.readouterr().out == expected + "\n\n"


def test_a_template_that_refuses_the_conversation_is_an_error_line_and_no_turn():
    repl, out, err = _repl(["Hi", "/exit"])
    repl.template = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    assert repl.run() == 0
    assert "error: the model's chat template rejected the conversation: roles must alternate" in (
        err.getvalue()
    )
    assert repl.conversation.turns == [] and out.getvalue() == ""


def test_ctrl_c_twice_at_the_prompt_leaves_and_once_only_warns():
    repl, _, err = _repl([KeyboardInterrupt(), "Hi", KeyboardInterrupt(), KeyboardInterrupt()])
    assert repl.run() == 0
    assert err.getvalue().count("Ctrl-C again") == 2  # the question between reset the count
    assert repl.conversation.turns[0] == user("Hi")


def test_a_ctrl_c_between_the_prompt_and_an_answer_counts_as_one_at_the_prompt(monkeypatch):
    repl, _, err = _repl(["Hi", KeyboardInterrupt()])

    def interrupted(question):  # the key lands after the line was read, before any answer
        raise KeyboardInterrupt

    monkeypatch.setattr(repl, "answer", interrupted)
    assert repl.run() == 0  # the hint, then the second Ctrl-C leaves: no traceback, exit 0
    assert "Ctrl-C again" in err.getvalue()
