"""Stop strings across piece boundaries: whatever the split, the same text and the same stop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.errors import TesseraError
from tessera.text.stop_strings import StopStringMatcher


def _oracle(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The answer read off the whole text: the first stop to complete, and what precedes it."""
    best = None
    for end in range(1, len(text) + 1):
        for stop in stops:
            if end >= len(stop) and text[end - len(stop) : end] == stop:
                if best is None or len(stop) > len(best[1]):
                    best = (end - len(stop), stop)
        if best is not None:
            return text[: best[0]], best[1]
    return text, None


def _run(pieces: list[str], stops: list[str]) -> tuple[str, str | None, list[str]]:
    matcher = StopStringMatcher(stops)
    sent = []
    for piece in pieces:
        check = matcher.feed(piece)
        sent.append(check.text)
        if check.stopped:
            return "".join(sent), check.stop, sent
    sent.append(matcher.flush())
    return "".join(sent), None, sent


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@given(
    text=st.text(alphabet="ab<|>", max_size=30),
    stops=st.lists(st.text(alphabet="ab<|>", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_any_split_gives_the_text_before_the_first_stop(text, stops, cuts):
    sent, stop, _ = _run(_split(text, cuts), stops)
    assert (sent, stop) == _oracle(text, stops)


def test_a_stop_cut_across_pieces_is_held_then_dropped():
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("Hello <|").text == "Hello "
    assert matcher.feed("en").text == ""
    check = matcher.feed("d|> trailing")
    assert (check.text, check.stop) == ("", "<|end|>")
    assert matcher.feed("more").text == ""


def test_a_held_prefix_that_does_not_complete_is_released():
    matcher = StopStringMatcher(["<|end|>"])
    assert matcher.feed("a <|e").text == "a "
    check = matcher.feed("xit")
    assert (check.text, check.stopped) == ("<|exit", False)
    matcher.feed("<")
    assert matcher.flush() == "<"


def test_of_two_stops_the_one_completed_first_wins():
    # "bc" completes before "abcd" does, though "abcd" starts earlier
    assert _run(["abcd"], ["abcd", "bc"])[:2] == ("a", "bc")
    assert _run(["a", "b", "c", "d"], ["abcd", "bc"])[:2] == ("a", "bc")


def test_empty_stop_string_is_refused():
    with pytest.raises(TesseraError, match="non-empty"):
        StopStringMatcher(["</s>", ""])


def test_a_single_string_is_one_stop():
    assert _run(["x</s>y"], "</s>")[:2] == ("x", "</s>")
