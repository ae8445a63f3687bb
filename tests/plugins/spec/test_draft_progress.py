"""Loading the draft model of ``--spec-type draft`` draws a bar on a terminal's stderr, as
the target's load does, and nothing into a pipe."""

from __future__ import annotations

from tessera.contract.spec import SpecParams
from tessera.engine.context import Context, ContextParams
from tessera.engine.drafting import create_decoder
from tessera.files.load import default_model_path, load_model
from tessera.plugin_manager import Runtime
from tessera.testing.terminal import stderr_on_a_terminal

DRAFT = default_model_path().parent / "tessera-default-draft.gguf"


def test_the_draft_models_load_draws_a_bar_on_a_terminal_only(capsys):
    runtime = Runtime()
    target = load_model(default_model_path(), runtime, "numpy")
    ctx = Context(target, ContextParams(n_ctx=128))
    params = SpecParams(model_draft=str(DRAFT), draft_max=4, p_min=0.0)
    with stderr_on_a_terminal() as term:
        create_decoder(runtime, "draft", ctx, params)
    assert f"loading {DRAFT.name}" in term.text and "tensor" in term.text
    create_decoder(runtime, "draft", ctx, params)
    assert capsys.readouterr().err == ""
