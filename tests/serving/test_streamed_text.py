"""A completion's streamed text, shared by both engines: nothing a stop string later cuts off is
ever sent, an unfinished UTF-8 character waits for its last byte, and the deltas add up to the
final text."""

from __future__ import annotations

import pytest

from mint.serving.streamed_text import StreamedText, holdback

pytestmark = pytest.mark.backend_free


def pieces_decoder(pieces: list[str]):
    """A decoder whose token i is the text pieces[i]."""
    return lambda tokens: "".join(pieces[t] for t in tokens)


def test_holdback_keeps_an_unfinished_character_and_a_tail_that_may_become_a_stop() -> None:
    assert holdback("hello", ()) == 0
    assert holdback("hello wor", ("world",)) == 3
    assert holdback("hello\ufffd", ("END",)) == 1
    assert holdback("go E\ufffd", ("END",)) == 2  # the replacement character, then "E"
    assert holdback("hello", ("lo!", "o!")) == 2  # the longest tail that starts some stop


def test_streamed_deltas_never_hold_text_a_stop_string_cuts_off() -> None:
    pieces = ["The", " answer", " is", " 4", "<", "/a", "nswer>"]
    text = StreamedText(pieces_decoder(pieces), ["</answer>"], streaming=True)
    sent, stop = [], None
    for n in range(1, len(pieces) + 1):
        delta, stop = text.advance(list(range(n)))
        sent.append(delta)
        if stop is not None:
            break
    assert stop == "</answer>"
    assert "".join(sent) == "The answer is 4"
    assert sent[4:] == ["", "", ""]  # "<", "</a" and the stop itself were held back
    assert text.rest("The answer is 4") == ""


def test_a_stop_found_across_tokens_and_the_rest_of_a_length_finish() -> None:
    pieces = ["ab", "cS", "TOP", "x"]
    text = StreamedText(pieces_decoder(pieces), ["STOP"], streaming=True)
    assert text.advance([0]) == ("ab", None)
    assert text.advance([0, 1]) == ("c", None)  # "S" may begin the stop
    assert text.advance([0, 1, 2]) == ("", "STOP")

    free = StreamedText(pieces_decoder(pieces), ["zz"], streaming=True)
    assert free.release("abz") == "ab"
    assert free.rest("abzy") == "zy"  # the final text goes whole
    assert free.rest("abzy") == ""


def test_a_request_answered_whole_streams_nothing_but_still_finds_its_stops() -> None:
    pieces = ["a", "b", "END"]
    text = StreamedText(pieces_decoder(pieces), ["END"], streaming=False)
    assert text.advance([0, 1]) == ("", None)
    assert text.advance([0, 1, 2]) == ("", "END")
    assert text.rest("ab") == ""
