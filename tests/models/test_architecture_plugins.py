"""Every architecture family is its own plugin: ``tessera plugins`` lists it under its entry
point and module, disabling that entry point removes exactly its architectures, and
docs/plugins/ has its page (what it is, when it applies, its switch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli.main import main

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plugins"
#: entry point: (module, the ``general.architecture`` names it registers)
FAMILIES = {
    "arch-gemma2": ("tessera.models.gemma.gemma2", {"gemma2"}),
    "arch-gemma3": ("tessera.models.gemma.gemma3", {"gemma3"}),
    "arch-phi3": ("tessera.models.llama.phi3", {"phi3"}),
    "arch-mistral": ("tessera.models.llama.mistral", {"mistral3"}),
    "arch-granite": ("tessera.models.llama.granite", {"granite"}),
    "arch-granitemoe": ("tessera.models.llama.granite_moe", {"granitemoe"}),
    "arch-olmo2": ("tessera.models.llama.olmo2", {"olmo2"}),
    "arch-smollm3": ("tessera.models.llama.smollm3", {"smollm3"}),
    "arch-deepseek2": ("tessera.models.deepseek2.arch", {"deepseek2"}),
    "arch-glm4": ("tessera.models.llama.glm4", {"glm4"}),
    "arch-glm4moe": ("tessera.models.llama.glm4_moe", {"glm4moe"}),
    "arch-gpt-oss": ("tessera.models.gpt_oss.arch", {"gpt-oss"}),
    "arch-qwen3next": ("tessera.models.qwen3_next.arch", {"qwen3next"}),
}


def report(capsys, *flags: str) -> dict:
    assert main([*flags, "plugins", "--json", "--no-probe"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def everything() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plugins", "--json", "--no-probe"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("name", FAMILIES)
def test_the_family_is_listed_under_its_entry_point(everything, name):
    module, arches = FAMILIES[name]
    (plugin,) = [p for p in everything["plugins"] if p["name"] == name]
    assert plugin["module"] == module
    assert "tessera_register_architectures" in plugin["hooks"]
    assert arches <= set(everything["architectures"])


@pytest.mark.parametrize("name", FAMILIES)
def test_disabling_the_entry_point_removes_exactly_its_architectures(everything, capsys, name):
    without = report(capsys, "--disable-plugins", name)
    assert name not in {p["name"] for p in without["plugins"]}
    assert set(everything["architectures"]) - set(without["architectures"]) == FAMILIES[name][1]


@pytest.mark.parametrize("name", FAMILIES)
def test_the_family_has_its_page(name):
    page = (DOCS / f"{name}.md").read_text(encoding="utf-8")
    assert page.startswith(f"# {name} — ")
    for section in ("**What.**", "**When it applies.**", "**Switch"):
        assert section in page, f"{name}.md lacks {section}"
