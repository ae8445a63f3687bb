"""``tessera plugins --json`` and the report of broken plugins: named, explained, skipped."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tessera.cli.main import main
from tessera.cli.plugins_cmd import REPORT_SCHEMA
from tessera.contract.backend import CORE_OPS
from tessera.plugin_manager import Runtime
from tessera.testing import make_gguf

BROKEN = {
    "broken-import": ("tessera_test_report_missing", None),
    "no-api": ("tessera_test_report_noapi", "from tessera.hookspecs import hookimpl\n"),
    "future-api": ("tessera_test_report_future", "TESSERA_PLUGIN_API = 3\n"),
    "typo-hook": (
        "tessera_test_report_typo",
        textwrap.dedent(
            """
            from tessera.hookspecs import hookimpl
            TESSERA_PLUGIN_API = 2
            @hookimpl
            def tessera_register_backend(register):
                pass
            """
        ),
    ),
    "raises": (
        "tessera_test_report_raises",
        textwrap.dedent(
            """
            from tessera.hookspecs import hookimpl
            TESSERA_PLUGIN_API = 2
            @hookimpl
            def tessera_register_quant_types(register):
                raise ValueError("block table is corrupt")
            """
        ),
    ),
}


@pytest.fixture
def broken_site(tmp_path, monkeypatch):
    """An installed distribution whose five plugins are each broken in another way."""
    info = tmp_path / "tessera_test_report-0.3.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tessera-test-report\nVersion: 0.3.0\n"
    )
    lines = "\n".join(f"{name} = {module}" for name, (module, _) in BROKEN.items())
    (info / "entry_points.txt").write_text(f"[tessera]\n{lines}\n")
    for module, source in BROKEN.values():
        if source is not None:
            (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TESSERA_STRICT_PLUGINS", "0")
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("tessera_test_report")]:
        del sys.modules[name]


def plugins_json(capsys, *argv: str) -> dict:
    code = main([*argv, "plugins", "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


def test_json_report_has_the_stable_schema(capsys):
    report = plugins_json(capsys)
    assert report["schema"] == REPORT_SCHEMA
    assert set(report) == {
        "schema", "tessera_version", "plugin_api", "plugins", "failures", "architectures",
        "quant_types", "commands", "backends", "conflicts", "communicators", "spec_decoders",
        "expert_caches", "constraint_kinds", "tokenizer_kinds", "switches",
    }  # fmt: skip
    assert {c["name"] for c in report["expert_caches"]} == set(Runtime().expert_caches())
    rt = Runtime()
    assert [p["name"] for p in report["plugins"]] == [p.name for p in rt.plugins]
    llama = next(p for p in report["plugins"] if p["name"] == "arch-llama")
    assert llama == {
        "name": "arch-llama",
        "module": "tessera.models.llama.arch",
        "distribution": "tessera",
        "version": rt.plugins[0].version,
        "hooks": ["tessera_register_architectures"],
    }
    assert report["architectures"] == sorted(rt.architectures())
    assert {q["name"]: q["ggml_type"] for q in report["quant_types"]} == {
        q.name: q.ggml_type for q in rt.quant_types().values()
    }
    assert report["commands"] == sorted(["plugins", *rt.commands()])
    numpy = next(b for b in report["backends"] if b["name"] == "numpy")
    assert numpy["usable"] and (numpy["device"], numpy["dtype"]) == ("cpu", "f32")
    assert sorted(numpy["ops"] + numpy["unsupported_ops"]) == sorted(CORE_OPS)
    assert numpy["ops"] == [op for op in CORE_OPS if op not in numpy["unsupported_ops"]]
    torch = next(b for b in report["backends"] if b["name"] == "torch")
    kernel_states = {k["quant_type"]: k["state"] for k in torch["kernels"]}
    assert set(kernel_states) == {q for (b, q) in rt.weight_kernels() if b == "torch"}
    assert set(kernel_states.values()) <= {"active", "declined by probe"}


def test_constraint_kinds_are_listed_as_the_plugins_register_them(capsys):
    kinds = {k["name"]: k["description"] for k in plugins_json(capsys)["constraint_kinds"]}
    assert kinds == {n: k.description for n, k in Runtime().constraint_kinds().items()}
    assert {"json_object", "json_schema", "gbnf", "regex", "choice", "tool_call"} <= set(kinds)
    assert main(["plugins", "--no-probe"]) == 0
    out = capsys.readouterr().out
    for name, description in kinds.items():
        assert f"constraint kind {name}: {description}" in out
    # the kinds come from the grammar plugin: without it there are none
    assert plugins_json(capsys, "--disable-plugins", "grammar")["constraint_kinds"] == []


def test_json_report_without_probing_creates_no_backend(capsys):
    report = plugins_json(capsys, "--disable-plugins", "cmd-run")
    assert "run" not in report["commands"]
    code = main(["plugins", "--json", "--no-probe"])
    no_probe = json.loads(capsys.readouterr().out)
    assert code == 0
    for backend in no_probe["backends"]:
        assert backend["usable"] is None and backend["ops"] is None
        assert all(k["state"] == "not probed" for k in backend["kernels"])


def test_broken_plugins_are_reported_by_name_and_the_runtime_still_runs(
    broken_site, capsys, tmp_path
):
    report = plugins_json(capsys)
    errors = {f["name"]: f["error"] for f in report["failures"]}
    assert set(errors) == set(BROKEN)
    assert errors["broken-import"].startswith("ModuleNotFoundError: No module named")
    assert "does not declare TESSERA_PLUGIN_API" in errors["no-api"]
    assert "declares TESSERA_PLUGIN_API=3 but this tessera speaks 2" in errors["future-api"]
    assert "unknown hook 'tessera_register_backend'" in errors["typo-hook"]
    assert (
        "tessera_register_quant_types raised ValueError: block table is corrupt"
        in (errors["raises"])
    )
    loaded = {p["name"] for p in report["plugins"]}
    assert {"typo-hook", "no-api", "future-api"}.isdisjoint(loaded)
    assert "Q8_0" in {q["name"] for q in report["quant_types"]}

    model = make_gguf(tmp_path / "tiny.gguf", "llama")
    code = main(["run", "-m", str(model), "-p", "hi", "-n", "3", "--backend", "numpy"])
    out, err = capsys.readouterr()
    assert code == 0 and out
    warnings = [line for line in err.splitlines() if line.startswith("warning: plugin")]
    assert len(warnings) == len(BROKEN)
    assert (
        "warning: plugin 'broken-import' skipped: ModuleNotFoundError: No module named "
        "'tessera_test_report_missing' (tessera runs without it; --disable-plugins "
        "broken-import stops loading it)"
    ) in warnings


def test_text_listing_marks_failed_plugins(broken_site, capsys):
    assert main(["--disable-plugins", "broken-import,no-api,typo-hook", "plugins"]) == 0
    out = capsys.readouterr().out
    assert "  future-api: FAILED — declares TESSERA_PLUGIN_API=3" in out
    assert "broken-import" not in out


def test_strict_mode_turns_a_broken_plugin_into_one_error_line(broken_site, capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_STRICT_PLUGINS", "1")
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: plugin '") and "failed to load" in err[-1]


def test_report_lists_communicators_with_their_probe_here(capsys):
    report = plugins_json(capsys)
    by_name = {c["name"]: c for c in report["communicators"]}
    assert set(by_name) == set(Runtime().communicators())
    pairwise, torch_dist = by_name["pairwise"], by_name["torch-distributed"]
    assert (pairwise["collective"], pairwise["max_ranks"], pairwise["usable"]) == (False, 2, True)
    assert torch_dist["collective"] and torch_dist["usable"] and "gloo" in torch_dist["features"]
    main(["plugins", "--no-probe"])
    text, _ = capsys.readouterr()
    assert "communicator pairwise: at most 2 ranks; usable here: tcp" in text


def test_switches_lists_every_declared_switch_with_its_owner_and_value(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_KV_ROWS_DISABLE", "1")
    monkeypatch.setenv("TESSERA_DISABLE_KERNELS", "q4_0, q8_0")
    monkeypatch.delenv("TESSERA_PRUNE_DISABLE", raising=False)
    assert main(["plugins", "--switches"]) == 0
    lines = capsys.readouterr().out.splitlines()
    columns = ["switch", "owner", "kind", "default", "value", "what it does"]
    starts = [lines[0].index(c) for c in columns]
    assert starts == sorted(starts)
    cut = list(zip(starts, [*starts[1:], None], strict=True))
    rows = {}
    assert lines[-1].startswith("kinds — off: a flag; 1 turns its path off")
    for line in lines[1:-1]:
        cells = [line[a:b].strip() for a, b in cut]
        rows[cells[0]] = cells
    rt = Runtime()
    assert set(rows) == set(rt.switches())
    owners = rt.owners("switch")
    for name, (_, owner, kind, default, _value, help_) in rows.items():
        switch = rt.switches()[name]
        assert (owner, kind, default, help_) == (
            owners[name],
            switch.kind,
            switch.shown_default(),
            switch.help,
        )
    assert rows["TESSERA_KV_ROWS_DISABLE"][1:5] == ["core", "off", "0", "1"]
    assert rows["TESSERA_DISABLE_KERNELS"][4] == "q4_0, q8_0"
    assert rows["TESSERA_PRUNE_DISABLE"][4] == "unset"
    assert rows["TESSERA_BERT_FUSED_QKV"][1] == "arch-bert"
    assert rows["TESSERA_Q4_0_DENSE_ROWS"][1] == "quant-q4_0"


def test_switches_in_the_json_report(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_GRAMMAR_REJECTION", "0")
    monkeypatch.setenv("TESSERA_SPEC_ADAPTIVE", "sometimes")
    monkeypatch.delenv("TESSERA_COMMUNICATOR", raising=False)
    entries = {
        e["name"]: e for e in plugins_json(capsys, "--disable-plugins", "arch-bert")["switches"]
    }
    rt = Runtime(disabled=["arch-bert"])
    assert list(entries) == list(rt.switches())
    assert "TESSERA_BERT_FUSED_QKV" not in entries  # its plugin is not loaded
    assert entries["TESSERA_GRAMMAR_REJECTION"] == {
        "name": "TESSERA_GRAMMAR_REJECTION",
        "owner": "grammar",
        "kind": "on",
        "default": "1",
        "choices": [],
        "value": "0",
        "error": None,
        "help": rt.switches()["TESSERA_GRAMMAR_REJECTION"].help,
    }
    assert entries["TESSERA_COMMUNICATOR"]["value"] is None
    bad = entries["TESSERA_SPEC_ADAPTIVE"]
    assert bad["value"] == "sometimes" and "TESSERA_SPEC_ADAPTIVE='sometimes'" in bad["error"]


def test_a_switch_set_to_a_value_it_does_not_take_is_one_error_line(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_KV_ROWS_DISABLE", "2")
    assert main(["plugins"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: TESSERA_KV_ROWS_DISABLE='2' is not a value this switch")
