"""The grammar plugin's constraints: masks against an independent oracle (the ``regex``
package's partial matching), outputs against json.loads / jsonschema / re, and the sampled
distribution against the masked sampler chain computed directly."""

from __future__ import annotations

import json
import re

import attrs
import jsonschema
import numpy as np
import pytest
import regex

from tessera.contract.constraints import ConstraintSpecError
from tessera.engine.sampling import Sampler, SamplerParams
from tessera.errors import TesseraError
from tessera.files.load import default_model_path
from tessera.plugin_manager import Runtime
from tessera.text.tokenizer import Tokenizer

CHAINS = {
    "plain": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "default": SamplerParams(),
    "top-k": SamplerParams(temperature=0.7, top_k=3, top_p=1.0, min_p=0.0),
    "top-k-top-p-min-p": SamplerParams(temperature=1.3, top_k=5, top_p=0.8, min_p=0.05),
    "min-p": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2),
    "top-p": SamplerParams(temperature=0.9, top_k=0, top_p=0.9, min_p=0.0),
    "penalty": SamplerParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.5),
}
PATTERN = r"[0-9]{2,3}(-[a-f]{1,4})*;"
GBNF = 'root ::= "(" word ("," word)* ")"\nword ::= [a-z] [a-z]? [a-z]?'
GBNF_AS_REGEX = r"\([a-z]{1,3}(,[a-z]{1,3})*\)"


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_path(default_model_path())


@pytest.fixture(scope="module")
def runtime():
    return Runtime()


def compiled(runtime, kind, spec, tokenizer):
    return runtime.constraint_kind(kind).compile(spec, tokenizer)


def oracle_mask(tokenizer, pattern: str, text: str) -> np.ndarray:
    """Tokens after which ``text`` is still a prefix of a match of ``pattern`` (tokens that
    are not whole UTF-8 alone, and special tokens, never fit a text pattern here); an
    end-of-generation token fits where ``text`` is a whole match."""
    out = np.zeros(tokenizer.n_vocab, dtype=bool)
    whole = regex.fullmatch(pattern, text) is not None
    for i in range(tokenizer.n_vocab):
        if tokenizer.is_eog(i):
            out[i] = whole
            continue
        try:
            piece = tokenizer.token_to_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if piece and not tokenizer.is_special(i):
            out[i] = regex.fullmatch(pattern, text + piece, partial=True) is not None
    return out


def walk(constraint, tokenizer, text: str):
    """Feed ``text``'s tokens one by one, yielding the text before each."""
    done = ""
    for token in tokenizer.encode(text, add_special=False):
        yield done
        constraint.accept(token)
        done += tokenizer.token_to_bytes(token).decode("utf-8")
    yield done


@pytest.mark.parametrize(
    "kind, spec, pattern, text",
    [
        ("regex", PATTERN, PATTERN, "123-abc-f;"),
        ("gbnf", GBNF, GBNF_AS_REGEX, "(ab,c,def)"),
        ("choice", ["red", "green", "gray"], "red|green|gray", "green"),
    ],
)
def test_masks_match_the_regex_oracle_along_a_document(runtime, tokenizer, kind, spec, pattern,
                                                       text):  # fmt: skip
    constraint = compiled(runtime, kind, spec, tokenizer)()
    decodable = np.array([_whole_utf8(tokenizer, i) for i in range(tokenizer.n_vocab)])
    n_forced = 0
    for done in walk(constraint, tokenizer, text):
        forced = constraint.matcher.compute_ff_bytes()
        mask = constraint.allowed_mask().copy()
        # multi-byte pieces split across tokens are the oracle's blind spot: compare the rest
        expected = oracle_mask(tokenizer, pattern, done)[decodable]
        if forced:
            # bytes the language forces come as their canonical tokens: a subset, never empty
            n_forced += 1
            assert mask[decodable].any() and not (mask[decodable] & ~expected).any()
        else:
            np.testing.assert_array_equal(mask[decodable], expected, err_msg=repr(done))
    assert n_forced < len(text)  # the exact comparison ran too
    assert constraint.complete or mask[sorted(tokenizer.eog_ids)].all()


def _whole_utf8(tokenizer, i: int) -> bool:
    try:
        tokenizer.token_to_bytes(i).decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("chain", CHAINS)
def test_sampled_outputs_are_json_objects(runtime, tokenizer, chain):
    factory = compiled(runtime, "json_object", None, tokenizer)
    rng = np.random.default_rng(7)
    for seed in range(3):
        text, ended = generate(factory, tokenizer, CHAINS[chain], rng, seed)
        if ended:
            assert isinstance(json.loads(text), dict)
        else:
            assert text.lstrip().startswith("{")


def generate(factory, tokenizer, params, rng, seed, limit=400):
    """Random logits through one constrained generation: (text, ended by itself)."""
    sampler = Sampler(attrs.evolve(params, seed=seed))
    constraint, out = factory(), []
    while len(out) < limit:
        logits = rng.normal(scale=2.0, size=tokenizer.n_vocab).astype(np.float32)
        token = constraint.sample(sampler, logits, out)
        if tokenizer.is_eog(token):
            return tokenizer.decode(out), True
        constraint.accept(token)
        out.append(token)
        if constraint.complete:
            return tokenizer.decode(out), True
    return tokenizer.decode(out), False


def test_schema_outputs_validate_against_the_schema(runtime, tokenizer):
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": -5, "maximum": 500},
            "name": {"type": "string", "maxLength": 6},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        },
        "required": ["id", "name", "tags"],
        "additionalProperties": False,
    }
    factory = compiled(runtime, "json_schema", schema, tokenizer)
    rng = np.random.default_rng(1)
    for seed in range(4):
        text, ended = generate(factory, tokenizer, CHAINS["plain"], rng, seed)
        assert ended
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("rejection", ["1", "0"], ids=["rejection", "mask"])
def test_greedy_is_the_argmax_over_allowed_tokens(runtime, tokenizer, rejection, monkeypatch):
    monkeypatch.setenv("TESSERA_GRAMMAR_REJECTION", rejection)
    constraint = compiled(runtime, "regex", PATTERN, tokenizer)()
    assert constraint.rejection == (rejection == "1")
    sampler = Sampler(SamplerParams(temperature=0.0))
    rng = np.random.default_rng(3)
    text, steps = "", 0
    while not constraint.complete and steps < 40:
        logits = rng.normal(size=tokenizer.n_vocab).astype(np.float32)
        allowed = oracle_mask(tokenizer, PATTERN, text)
        expected = int(np.flatnonzero(allowed)[np.argmax(logits[allowed])])
        token = constraint.sample(sampler, logits, [])
        assert token == expected
        if tokenizer.is_eog(token):
            break
        constraint.accept(token)
        text += tokenizer.token_to_bytes(token).decode("utf-8")
        steps += 1
    assert re.fullmatch(PATTERN, text)


def test_the_rejection_path_skips_the_mask_when_the_argmax_fits(runtime, tokenizer, monkeypatch):
    monkeypatch.setenv("TESSERA_GRAMMAR_REJECTION", "1")
    constraint = compiled(runtime, "choice", ["hello", "world"], tokenizer)()
    greedy = Sampler(SamplerParams(temperature=0.0))
    logits = np.zeros(tokenizer.n_vocab, dtype=np.float32)
    first = tokenizer.encode("hello", add_special=False)[0]
    logits[first] = 10.0
    assert constraint.sample(greedy, logits, []) == first
    assert constraint.n_masks == 0
    outside = tokenizer.encode("x", add_special=False)[0]
    logits[outside] = 20.0  # the argmax does not fit now: the mask decides
    assert constraint.sample(greedy, logits, []) == first
    assert constraint.n_masks == 1


def test_logits_padded_past_the_vocabulary_never_pick_padding(runtime, tokenizer):
    constraint = compiled(runtime, "json_object", None, tokenizer)()
    logits = np.zeros(tokenizer.n_vocab + 64, dtype=np.float32)
    logits[tokenizer.n_vocab :] = 100.0
    token = constraint.sample(Sampler(SamplerParams(temperature=0.0)), logits, [])
    assert token < tokenizer.n_vocab and tokenizer.token_to_bytes(token).lstrip()[:1] == b"{"
    with pytest.raises(TesseraError, match="full logits row"):
        constraint.sample(Sampler(), logits[:10], [])


def test_end_of_generation_only_once_whole(runtime, tokenizer):
    constraint = compiled(runtime, "json_object", None, tokenizer)()
    eog = sorted(tokenizer.eog_ids)
    assert not constraint.allowed_mask()[eog].any()
    for token in tokenizer.encode('{"a": 1}', add_special=False):
        constraint.accept(token)
    assert constraint.complete
    np.testing.assert_array_equal(np.flatnonzero(constraint.allowed_mask()), eog)
    with pytest.raises(TesseraError, match="cannot continue the constrained output"):
        constraint.accept(tokenizer.encode("x", add_special=False)[0])


@attrs.define(eq=False)  # hashable by identity, as a real tokenizer
class _NoEog:
    pieces: list[bytes]
    n_vocab = property(lambda self: len(self.pieces))

    def token_to_bytes(self, i):
        return self.pieces[i]

    def is_eog(self, i):
        return False

    is_special = is_eog

    def encode(self, text, add_special=False):
        return []


def test_a_tokenizer_without_eog_is_refused(runtime):
    with pytest.raises(ConstraintSpecError, match="end-of-generation"):
        compiled(runtime, "json_object", None, _NoEog([b"{", b"}"]))


@pytest.mark.parametrize(
    "kind, spec, words",
    [
        ("gbnf", 'root ::= "a" missing', "missing"),
        ("gbnf", "", "non-empty"),
        ("regex", "a(b", "unclosed group"),
        ("json_schema", {"type": "objectx"}, "objectx"),
        ("json_schema", "{bad", "not JSON"),
        ("json_schema", {"type": "array", "uniqueItems": True}, "uniqueItems"),
        ("choice", ["a", 3], "non-empty list"),
        ("tool_call", {"family": "content-only", "tools": []}, "cannot be forced"),
        ("tool_call", {"family": "hermes", "tools": []}, "at least one tool"),
    ],
)
def test_refused_specs_name_the_problem(runtime, tokenizer, kind, spec, words):
    with pytest.raises(ConstraintSpecError, match=re.escape(words)):
        compiled(runtime, kind, spec, tokenizer)


def test_compiled_grammars_are_cached_per_tokenizer_and_spec(runtime, tokenizer):
    first = compiled(runtime, "regex", "[a-z]+", tokenizer)
    again = compiled(runtime, "regex", "[a-z]+", tokenizer)
    other = compiled(runtime, "regex", "[a-z]+!", tokenizer)
    matcher = first.__closure__  # the factory closes over its compiled matcher
    assert {id(c.cell_contents) for c in matcher} & {id(c.cell_contents) for c in again.__closure__}
    assert first().matcher is not first().matcher  # each generation gets its own copy
    assert other().matcher is not None


@pytest.mark.parametrize("chain", [c for c in CHAINS if c != "penalty"])
def test_draws_equal_the_sampler_on_oracle_masked_logits(runtime, tokenizer, chain):
    """Two samplers with one seed: the constrained draw and the plain draw on logits masked
    by the oracle must agree draw for draw (the constraint changes nothing but the mask)."""
    factory = compiled(runtime, "regex", PATTERN, tokenizer)
    allowed = oracle_mask(tokenizer, PATTERN, "12")
    rng = np.random.default_rng(11)
    mine = Sampler(attrs.evolve(CHAINS[chain], seed=5))
    oracle = Sampler(attrs.evolve(CHAINS[chain], seed=5))
    seen = set()
    for _ in range(200):
        constraint = factory()
        for token in tokenizer.encode("12", add_special=False):
            constraint.accept(token)
        logits = rng.normal(scale=1.5, size=tokenizer.n_vocab).astype(np.float32)
        token = constraint.sample(mine, logits, [])
        assert token == oracle.sample(np.where(allowed, logits, -np.inf).astype(np.float32))
        seen.add(token)
    assert len(seen) > 1


def test_the_extension_guide_example_constraint_runs(tokenizer):
    from pathlib import Path

    guide = Path(__file__).resolve().parents[3] / "docs" / "extending.md"
    section = guide.read_text(encoding="utf-8").split("### `tessera_register_constraints`")[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "extending.md", "exec"), namespace)
    with pytest.raises(ConstraintSpecError, match="positive integer"):
        namespace["compile_digits"](0, tokenizer)
    constraint = namespace["compile_digits"](3, tokenizer)()
    sampler, out = Sampler(SamplerParams(temperature=1.0, seed=1)), []
    rng = np.random.default_rng(0)
    while not constraint.complete:
        logits = rng.normal(size=tokenizer.n_vocab).astype(np.float32)
        out.append(constraint.sample(sampler, logits, out))
        constraint.accept(out[-1])
    assert len(out) == 3 and tokenizer.decode(out).isdigit()


def _accepts(factory, tokenizer, text: str) -> bool:
    """Whether ``text`` (tokenized as the model would) is a whole sentence of the grammar."""
    constraint = factory()
    for token in tokenizer.encode(text, add_special=False):
        if not constraint.allowed_mask()[token]:
            return False
        constraint.accept(token)
    return bool(constraint.complete or constraint.allowed_mask()[sorted(tokenizer.eog_ids)].any())


@pytest.mark.parametrize(
    "grammar, good, bad",
    [
        ('root ::= a | b # a comment\na ::= "x"\nb ::= "y"', "y", "z"),
        ('root ::= "\\"" [^"\\\\]* "\\""', '"ab c"', '"a"b"'),
        ("root ::= [0-9]{2,4}", "123", "12345"),
        ("root ::= [0-9]{2,}", "12345", "1"),
        ('root ::= "\\x41" [\\u00e9-\\u00ff]+ "\\n"', "Aéü\n", "Aa\n"),
        ('root ::= "\\u00e9t\\u00E9"', "été", "ete"),
        ('root ::=\n  "{" ws (\n    "a"\n    ("," ws "a")*\n  )? "}"\nws ::= [ ]?', "{a, a}",
         "{a,}"),
        ('root ::= my-rule+\nmy-rule ::= "z"', "zzz", "zy"),
        ('root ::= "<" . ">"', "<q>", "<>"),
        ('root ::= "a" ( "b" | )', "a", "ac"),
    ],
    ids=["comment", "negated-class", "count-range", "count-min", "escapes", "u-literal",
         "multi-line", "dash-name", "any-char", "empty-alternative"],
)  # fmt: skip
def test_gbnf_features_of_the_llama_cpp_dialect(runtime, tokenizer, grammar, good, bad):
    factory = compiled(runtime, "gbnf", grammar, tokenizer)
    assert _accepts(factory, tokenizer, good)
    assert not _accepts(factory, tokenizer, bad)
