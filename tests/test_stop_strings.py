"""Stop strings cut streamed text exactly where they would cut the whole text, whatever the pieces."""

from __future__ import annotations

import itertools

import numpy as np

from spec_cli.api.stop_strings import StopStrings


def cut(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    matcher = StopStrings(stops)
    released = []
    for piece in pieces:
        released.append(matcher.feed(piece))
        if matcher.stopped:
            return "".join(released), True
    return "".join(released) + matcher.flush(), False


def test_a_stop_string_split_over_pieces_is_found_and_not_released() -> None:
    assert cut(["Hello wo", "rld\nUs", "er: hi"], ["\nUser:"]) == ("Hello world", True)


def test_a_tail_that_only_looked_like_a_stop_is_released_later() -> None:
    matcher = StopStrings(["</end>"])
    assert matcher.feed("a </e") == "a "  # "</e" may begin the stop string: held
    assert matcher.feed("x") == "</ex"  # it did not
    assert matcher.flush() == ""


def test_without_a_stop_everything_is_released_in_order() -> None:
    assert cut(["ab", "c<", "/d"], ["</end>"]) == ("abc</d", False)


def test_no_stop_strings_releases_each_piece_at_once() -> None:
    matcher = StopStrings(["", ""])
    assert [matcher.feed(p) for p in ("a", "b")] == ["a", "b"] and not matcher.stopped


def test_any_split_of_a_random_text_cuts_where_the_whole_text_is_cut() -> None:
    """On random texts over a tiny alphabet, every split into pieces gives the cut of the unsplit text:
    the text before the earliest occurrence of any stop string (stops that do not overlap each other)."""
    rng = np.random.default_rng(0)
    stops = ["aba", "cc"]
    for _ in range(200):
        text = "".join(rng.choice(list("abc"), size=9))
        found = [i for i in (text.find(s) for s in stops) if i >= 0]
        expected = (text[:min(found)], True) if found else (text, False)
        for a, b in itertools.combinations(range(1, len(text)), 2):
            assert cut([text[:a], text[a:b], text[b:]], stops) == expected, (text, a, b)
