"""A completion's text while its tokens arrive: where a stop string appears, and what may stream.

Both engines stream the same way. Text is released only up to the point where it can no longer
change: an unfinished UTF-8 character (shown as U+FFFD until its last byte comes) and a tail
that may still grow into a stop string are held back, so a client never receives text that a
stop string later cuts off. The torch engine also finds stop strings here as each token arrives;
vLLM finds its own, and this releases its deltas. Imports neither torch nor vLLM (the vLLM
engine runs in a venv of its own).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def holdback(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of streamed text to keep back: an unfinished UTF-8 character
    (shown as U+FFFD), and the longest tail that could still grow into a stop string."""
    unfinished = len(text) - len(text.rstrip("\ufffd"))
    stable = text[: len(text) - unfinished]
    partial = max((k for stop in stops for k in range(1, len(stop)) if stable.endswith(stop[:k])), default=0)
    return unfinished + partial


class StreamedText:
    """One request's completion text as tokens arrive: stop strings found, stream deltas released safely.

    `decode` turns the completion's tokens so far into its text; `streaming` False releases
    nothing (a request answered whole still has its stop strings found).
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str], streaming: bool) -> None:
        self._decode = decode
        self._stops = tuple(stops)
        self._longest_stop = max((len(s) for s in self._stops), default=0)
        self.streaming = streaming
        self._searched = 0  # characters of the text already searched for stop strings
        self._sent = 0  # characters already streamed

    def advance(self, tokens: list[int]) -> tuple[str, str | None]:
        """(text to stream now, the stop string that now appears, if one does), after a new token."""
        if not self._stops and not self.streaming:
            return "", None
        text = self._decode(tokens)
        found = self._find_stop(text)
        if found is not None:
            return "", found[1]
        return self.release(text), None

    def release(self, text: str) -> str:
        """The part of `text` (the completion so far) not streamed yet and safe to stream now."""
        if not self.streaming:
            return ""
        safe = len(text) - holdback(text, self._stops)
        delta = text[self._sent : safe] if safe > self._sent else ""
        self._sent = max(self._sent, safe)
        return delta

    def rest(self, final_text: str) -> str:
        """The part of the final text not streamed yet: all of it may go now."""
        rest = final_text[self._sent :] if self.streaming else ""
        self._sent = len(final_text)
        return rest

    def _find_stop(self, text: str) -> tuple[int, str] | None:
        # A new match ends in the newest token's text, so only the tail needs searching again.
        start = max(0, self._searched - self._longest_stop + 1)
        self._searched = len(text)
        found = [(index, stop) for stop in self._stops if (index := text.find(stop, start)) >= 0]
        return min(found) if found else None
