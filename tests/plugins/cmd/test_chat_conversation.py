"""Saved conversations: a round trip keeps every message, a failed save leaves the old file
whole and no temporary file behind, and a file that is not a conversation is refused."""

from __future__ import annotations

import json

import pytest

from tessera.errors import TesseraError
from tessera.plugins.cmd import chat_conversation
from tessera.plugins.cmd.chat_conversation import Conversation

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Qu'est-ce qu'une liste ? ✓"},
    {"role": "assistant", "content": "Une séquence.\n"},
]


def test_save_then_load_is_the_same_conversation(tmp_path):
    conv = Conversation("Be brief.", [dict(m) for m in MESSAGES[1:]])
    conv.save(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text(encoding="utf-8")) == {"messages": MESSAGES}
    assert Conversation.load(tmp_path / "c.json") == conv
    assert Conversation.load(tmp_path / "c.json").messages() == MESSAGES


def test_a_bare_list_without_a_system_message_loads(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(MESSAGES[1:]), encoding="utf-8")
    conv = Conversation.load(tmp_path / "c.json")
    assert conv.system is None and conv.messages() == MESSAGES[1:]


def test_clear_keeps_the_system_message():
    conv = Conversation("Be brief.", [dict(m) for m in MESSAGES[1:]])
    conv.clear()
    assert conv.messages() == MESSAGES[:1]


def test_a_failed_save_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    Conversation("old").save(path)
    before = path.read_bytes()

    def broken(obj, f, **kw):
        f.write('{"messages": [')  # half written, then the disk fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(chat_conversation.json, "dump", broken)
    with pytest.raises(OSError):
        Conversation("new", [dict(MESSAGES[1])]).save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


@pytest.mark.parametrize(
    "text, message",
    [
        ("not json", "is not JSON"),
        ('{"turns": []}', "holds no list of messages"),
        ('[{"role": "user", "content": 3}]', "holds no list of messages"),
        ('[{"role": "robot", "content": "hi"}]', "holds no list of messages"),
    ],
)
def test_what_is_not_a_conversation_is_refused(tmp_path, text, message):
    (tmp_path / "c.json").write_text(text, encoding="utf-8")
    with pytest.raises(TesseraError, match=message):
        Conversation.load(tmp_path / "c.json")


def test_saving_into_a_missing_folder_names_it(tmp_path):
    with pytest.raises(TesseraError, match="does not exist"):
        Conversation().save(tmp_path / "no" / "c.json")
