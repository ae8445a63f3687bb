"""The environment switches: one reader per kind with each switch's accepted values, a
clear error for any other value, ``choose`` (the switch wins, else the probe), the
``switch`` catalogue, and no module reading a ``TESSERA_*`` variable around them."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from tessera import switches
from tessera.errors import SwitchValueError, TesseraError
from tessera.plugin_manager import Runtime
from tessera.switches import (
    CHOICE,
    NAME,
    NAMES,
    NUMBER,
    OFF,
    ON,
    Switch,
    choose,
    flag,
    names,
    number,
    text,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("core", "backends", "models", "plugins")

X_OFF = Switch("TESSERA_TEST_OFF", "a path off", OFF)
X_ON = Switch("TESSERA_TEST_ON", "a path on unless 0", ON, default=True)
X_OPT_IN = Switch("TESSERA_TEST_OPT_IN", "a behaviour off unless 1", ON, default=False)
X_NAMES = Switch("TESSERA_TEST_NAMES", "some names", NAMES)
X_CHOICE = Switch("TESSERA_TEST_CHOICE", "a dtype", CHOICE, choices=("f32", "bf16"))
X_NAME = Switch("TESSERA_TEST_NAME", "a name", NAME)
X_ROWS = Switch("TESSERA_TEST_ROWS", "a row count", NUMBER, off_at=0.0)


# -- readers ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "true", "YES", " on ", "True"])
def test_flag_on_words(monkeypatch, value):
    monkeypatch.setenv(X_OFF.name, value)
    monkeypatch.setenv(X_ON.name, value)
    assert flag(X_OFF) is True and flag(X_ON) is True


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", " 0"])
def test_flag_off_words(monkeypatch, value):
    monkeypatch.setenv(X_OFF.name, value)
    monkeypatch.setenv(X_ON.name, value)
    assert flag(X_OFF) is False and flag(X_ON) is False


@pytest.mark.parametrize("value", [None, "", "   "])
def test_an_unset_or_empty_flag_is_its_default(monkeypatch, value):
    for s in (X_OFF, X_ON, X_OPT_IN):
        if value is None:
            monkeypatch.delenv(s.name, raising=False)
        else:
            monkeypatch.setenv(s.name, value)
    assert (flag(X_OFF), flag(X_ON), flag(X_OPT_IN)) == (False, True, False)


@pytest.mark.parametrize("value", ["2", "enabled", "-1"])
def test_a_flag_value_it_does_not_take_is_an_error_naming_switch_value_and_choices(
    monkeypatch, value
):
    monkeypatch.setenv(X_OFF.name, value)
    with pytest.raises(SwitchValueError) as err:
        flag(X_OFF)
    message = str(err.value)
    assert X_OFF.name in message and repr(value) in message
    assert "1, true, yes, on" in message and "0, false, no, off" in message
    assert isinstance(err.value, TesseraError)


def test_names_are_split_stripped_and_empty_parts_dropped(monkeypatch):
    monkeypatch.setenv(X_NAMES.name, " cmd-run, ,dummy ,")
    assert names(X_NAMES) == ["cmd-run", "dummy"]
    monkeypatch.delenv(X_NAMES.name)
    assert names(X_NAMES) == []


def test_a_choice_is_any_case_and_checked(monkeypatch):
    monkeypatch.setenv(X_CHOICE.name, "BF16")
    assert text(X_CHOICE) == "bf16"
    monkeypatch.setenv(X_CHOICE.name, "f64")
    with pytest.raises(SwitchValueError, match=r"TESSERA_TEST_CHOICE='f64'.*one of f32, bf16"):
        text(X_CHOICE)
    monkeypatch.delenv(X_CHOICE.name)
    assert text(X_CHOICE) is None


def test_a_name_is_kept_as_set(monkeypatch):
    monkeypatch.setenv(X_NAME.name, " Pairwise ")
    assert text(X_NAME) == "Pairwise"


@pytest.mark.parametrize(("value", "want"), [("96", 96.0), ("inf", math.inf), ("0", 0.0)])
def test_numbers(monkeypatch, value, want):
    monkeypatch.setenv(X_ROWS.name, value)
    assert number(X_ROWS) == want


@pytest.mark.parametrize("value", ["many", "nan", "1,5"])
def test_a_number_switch_refuses_what_is_not_a_number(monkeypatch, value):
    monkeypatch.setenv(X_ROWS.name, value)
    with pytest.raises(SwitchValueError, match=rf"TESSERA_TEST_ROWS='{value}'.*a number"):
        number(X_ROWS)


def test_a_reader_refuses_a_switch_of_another_kind():
    with pytest.raises(TypeError, match="TESSERA_TEST_NAMES is a 'names' switch"):
        flag(X_NAMES)


def test_a_switch_name_must_be_a_tessera_variable():
    with pytest.raises(ValueError, match="TESSERA_"):
        Switch("MY_SWITCH", "not ours", OFF)


# -- each declared switch keeps its documented values ------------------------------------


def declared() -> dict[str, Switch]:
    return Runtime().switches()


@pytest.mark.parametrize(
    ("name", "set_value", "want"),
    [
        # disable flags: "1" turns the path off, "0" and unset leave it on
        *((n, v, v == "1") for n in (
            "TESSERA_KV_ROWS_DISABLE", "TESSERA_PRUNE_DISABLE", "TESSERA_BATCHED_COPY_DISABLE",
            "TESSERA_MOE_FFN_DISABLE", "TESSERA_FUSED_LINEAR_DISABLE",
            "TESSERA_TP_REPLICATE_LM_HEAD",
        ) for v in ("1", "0", None)),
        # paths on by default: "0" turns them off
        *((n, v, v != "0") for n in (
            "TESSERA_SPEC_ADAPTIVE", "TESSERA_BERT_FUSED_QKV", "TESSERA_GRAMMAR_REJECTION",
        ) for v in ("1", "0", None)),
        # plugin-loading flags took the env_flag words
        *((n, v, v in ("1", "yes", "true", "on")) for n in (
            "TESSERA_STRICT_PLUGINS", "TESSERA_TRACE_HOOKS",
        ) for v in ("1", "yes", "true", "on", "0", "no", "false", "off", None)),
    ],
)  # fmt: skip
def test_each_flag_reads_its_documented_values(monkeypatch, name, set_value, want):
    switch = declared()[name]
    if set_value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, set_value)
    assert flag(switch) is want


# -- choose ------------------------------------------------------------------------------


def test_the_switch_wins_and_the_probe_never_runs(monkeypatch):
    def probe():
        raise AssertionError("a switched-off path must not be probed")

    monkeypatch.setenv(X_OFF.name, "1")
    assert choose(X_OFF, probe, on="rows", off="dense") == (
        "dense",
        "disabled by TESSERA_TEST_OFF=1",
    )
    monkeypatch.setenv(X_ON.name, "0")
    assert choose(X_ON, probe) == (False, "disabled by TESSERA_TEST_ON=0")
    monkeypatch.delenv(X_OPT_IN.name, raising=False)
    assert choose(X_OPT_IN, probe) == (False, "off unless TESSERA_TEST_OPT_IN=1")


def test_otherwise_the_probe_gives_the_path_and_its_reason(monkeypatch):
    monkeypatch.delenv(X_OFF.name, raising=False)
    assert choose(X_OFF, (True, "backend supports it"), "rows", "dense") == (
        "rows",
        "backend supports it",
    )
    assert choose(X_OFF, lambda: (False, "-fa off"), "rows", "dense") == ("dense", "-fa off")
    assert choose(X_OFF, True) == (True, "probe says yes")
    assert choose(X_OFF, lambda: False) == (False, "probe says no")
    monkeypatch.setenv(X_OFF.name, "0")
    assert choose(X_OFF, True).path is True
    assert str(choose(X_OFF, (True, "why"), "rows")) == "rows (why)"


def test_a_number_switch_turns_its_path_off_at_its_off_value(monkeypatch):
    monkeypatch.setenv(X_ROWS.name, "0")
    assert choose(X_ROWS, True) == (False, "disabled by TESSERA_TEST_ROWS=0")
    monkeypatch.setenv(X_ROWS.name, "8")
    assert choose(X_ROWS, True) == (True, "probe says yes")


def test_choose_refuses_a_switch_that_gates_no_path():
    with pytest.raises(TypeError, match="gates no path"):
        choose(X_NAMES, True)


def test_a_bad_value_of_a_gating_switch_stops_the_choice(monkeypatch):
    monkeypatch.setenv(X_OFF.name, "maybe")
    with pytest.raises(SwitchValueError, match="TESSERA_TEST_OFF='maybe'"):
        choose(X_OFF, True)


# -- the catalogue ------------------------------------------------------------------------


def test_core_switches_come_first_and_are_owned_by_core():
    rt = Runtime()
    listed = list(rt.switches())
    core = [s.name for s in switches.CORE_SWITCHES]
    assert listed[: len(core)] == core
    assert all(rt.owners("switch")[n] == "core" for n in core)
    assert rt.owners("switch")["TESSERA_BERT_FUSED_QKV"] == "arch-bert"


def test_a_plugin_that_declares_a_taken_name_is_a_conflict():
    class Clash:
        TESSERA_PLUGIN_API = 2

        @staticmethod
        def tessera_register_switches(register):
            register(Switch("TESSERA_KV_ROWS_DISABLE", "mine now", ON, default=True))
            register(Switch("TESSERA_CLASH_OWN", "really mine", OFF))

    from tessera.hookspecs import hookimpl

    Clash.tessera_register_switches = hookimpl(Clash.tessera_register_switches)
    rt = Runtime(only=["backend-numpy"])
    assert rt.add_plugin(Clash, "clash")
    assert rt.switches()["TESSERA_KV_ROWS_DISABLE"] is switches.KV_ROWS_DISABLE
    assert rt.owners("switch")["TESSERA_CLASH_OWN"] == "clash"
    assert any("TESSERA_KV_ROWS_DISABLE" in c and "clash" in c for c in rt.conflicts)


def _declared_in_source() -> set[str]:
    """Every ``Switch("TESSERA_...", ...)`` written in the source tree."""
    found = set()
    for folder in SOURCE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Switch"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                ):
                    found.add(node.args[0].value)
    return found


def test_every_switch_written_in_the_source_is_registered():
    assert set(Runtime().switches()) == _declared_in_source()


# -- nobody reads a TESSERA_* variable but tessera.switches ------------------------------


def _module_constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def direct_reads(source: str) -> list[int]:
    """Lines that read a ``TESSERA_*`` variable from ``os.environ`` / ``os.getenv``, or a
    variable whose name the code does not spell out (it could be one)."""
    tree = ast.parse(source)
    constants = _module_constants(tree)

    def suspicious(key: ast.AST) -> bool:
        if isinstance(key, ast.Constant):
            return str(key.value).startswith("TESSERA_")
        if isinstance(key, ast.Name) and key.id in constants:
            return constants[key.id].startswith("TESSERA_")
        return True  # computed: cannot tell, so it must not be here

    lines = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            is_getenv = (isinstance(func, ast.Attribute) and func.attr == "getenv") or (
                isinstance(func, ast.Name) and func.id == "getenv"
            )
            is_get = isinstance(func, ast.Attribute) and func.attr in ("get", "pop")
            if is_getenv or (is_get and _is_environ(func.value)):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice if isinstance(node.ctx, ast.Load) else None
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key = node.left
        if key is not None and suspicious(key):
            lines.append(node.lineno)
    return lines


#: Modules that read environment variables by computed names, and why that is no switch.
COMPUTED_READS_ALLOWED = {
    "plugins/tensor_parallel/testing.py": "saves and restores the variables a test sets",
}


def test_the_checker_finds_direct_reads():
    assert direct_reads('import os\nos.environ.get("TESSERA_X", "")\n') == [2]
    assert direct_reads('import os\nX = "TESSERA_X"\nv = os.environ[X]\n') == [3]
    assert direct_reads('import os\nv = os.getenv("TESSERA_X")\n') == [2]
    assert direct_reads('import os\nv = "TESSERA_X" in os.environ\n') == [2]
    assert direct_reads("import os\ndef f(env):\n    return os.environ.get(env)\n") == [3]
    assert direct_reads('import os\nos.environ.get("CC", "")\nos.environ["X"] = "1"\n') == []


def test_only_tessera_switches_reads_tessera_variables():
    offenders = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "core/switches.py" or rel in COMPUTED_READS_ALLOWED:
                continue
            offenders += [f"{rel}:{n}" for n in direct_reads(path.read_text(encoding="utf-8"))]
    assert offenders == [], "read these through tessera.switches: " + ", ".join(offenders)


def test_the_user_guide_table_lists_every_declared_switch_and_its_owner():
    guide = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
    table = guide[guide.index("## Environment switches") :].split("\n## ")[0]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| `TESSERA_"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`").split("=")[0]] = cells[1]
    rt = Runtime()
    assert rows == {name: rt.owners("switch")[name] for name in rt.switches()}
