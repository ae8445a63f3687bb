"""``tessera run``'s sampling flags beyond llama.cpp's basic ones reach the sampler: DRY (with
its breakers made from the model's vocabulary) and the penalties, against the in-process
generator with the same settings; a value out of range is refused by the flag parser."""

from __future__ import annotations

import pytest

from tessera.cli.main import main
from tessera.engine.context import Context, ContextParams
from tessera.engine.generate import generate
from tessera.engine.sampling import Sampler, SamplerParams

#: Greedy decoding repeats " 3, 3, 3, ..." after this prompt, so DRY and penalties show.
PROMPT = "1, 2, 3, 4, 5, 6,"
ARGS = ["--backend", "numpy", "--temp", "0", "-n", "12", "--no-timings", "-p", PROMPT]
DRY = ["--dry-multiplier", "2", "--dry-base", "1.5", "--dry-allowed-length", "1"]
DRY += ["--dry-penalty-last-n", "-1"]


def _text(capsys, argv) -> str:
    assert main(["run", *argv]) == 0
    return capsys.readouterr().out


def _reference(**settings) -> str:
    from tessera.files.load import default_model_path, load_model
    from tessera.plugin_manager import Runtime

    model = load_model(default_model_path(), Runtime(), backend="numpy")
    tok = model.tokenizer
    params = SamplerParams(temperature=0.0, **settings).with_vocabulary(tok)
    ids = tok.encode(PROMPT, add_special=True, parse_special=True)
    ctx = Context(model, ContextParams(n_ctx=256))
    return tok.decode(list(generate(ctx, ids, 12, Sampler(params), eog_ids=tok.eog_ids)))


def test_dry_flags_change_the_greedy_text_as_the_reference_does(capsys):
    plain = _text(capsys, ARGS)
    dry = _text(capsys, [*ARGS, *DRY])
    assert dry != plain
    want = _reference(dry_multiplier=2, dry_base=1.5, dry_allowed_length=1, dry_penalty_last_n=-1)
    assert dry.rstrip("\n") == want.rstrip("\n")


def test_penalty_flags_reach_the_sampler(capsys):
    got = _text(capsys, [*ARGS, "--frequency-penalty", "1.5", "--presence-penalty", "0.5"])
    assert got.rstrip("\n") == _reference(frequency_penalty=1.5, presence_penalty=0.5).rstrip("\n")


@pytest.mark.parametrize(
    "flag, value, field",
    [("--xtc-probability", "2", "xtc_probability"), ("--dry-base", "0.5", "dry_base"),
     ("--typical", "nan", "typical_p")],
)  # fmt: skip
def test_an_out_of_range_flag_is_refused_by_name(capsys, flag, value, field):
    with pytest.raises(SystemExit) as exit_:
        main(["run", *ARGS, flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and f"{field} must be" in err
