"""What an RL step graded: a few of its samples as the grader read them.

TRL, verl and every RL tool log a completions table, because a reward curve alone cannot tell
a model that fails from a grader that cannot read it. Each RL step's report carries a few of
its samples (`StepReport.samples`): the text as graded (a completion's text, or an episode's
last assistant message), its reward, the prompt's reference, and the grader's reason where it
gives one. A job records them in the step's event, which `mint jobs events` and the
dashboard's job page show; a run stopped for want of signal quotes them in its message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mint.chat.messages import message_text

# Samples shown per step: one from each of the first groups, then a second from each, and so on.
SHOWN_SAMPLES_PER_STEP = 4
# Characters of a shown text or reference; the rest is cut with an ellipsis.
SHOWN_CHARS = 400


@dataclass(frozen=True)
class GradedSample:
    """One sample as its grader saw it: the text graded, the reward it earned, the prompt's
    reference, and the grader's reason (empty where the grader gives none)."""

    text: str
    reward: float
    reference: Any
    detail: str = ""

    def record(self) -> dict[str, Any]:
        """The sample as JSON for a step's event: long texts and references cut to `SHOWN_CHARS`."""
        record: dict[str, Any] = {"text": _cut(self.text), "reward": round(self.reward, 4)}
        if self.reference is not None:
            reference = self.reference if isinstance(self.reference, str) else json.dumps(self.reference, default=str)
            record["reference"] = _cut(reference)
        if self.detail:
            record["detail"] = _cut(self.detail)
        return record


def graded_text(output: Any) -> str:
    """The text a grader reads from an RL output: the completion itself, or an episode's last
    assistant message (the messages it added, in order)."""
    if isinstance(output, str):
        return output
    for message in reversed(list(output)):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""


def shown_indices(group_sizes: Sequence[int], limit: int = SHOWN_SAMPLES_PER_STEP) -> list[tuple[int, int]]:
    """(group, sample) pairs to show: the first sample of each group, then the second, and so on,
    `limit` at most, so that a step of many prompts shows several prompts and one prompt several samples."""
    shown: list[tuple[int, int]] = []
    for sample in range(max(group_sizes, default=0)):
        for group, size in enumerate(group_sizes):
            if sample < size and len(shown) < limit:
                shown.append((group, sample))
    return shown


def explain(grader: Any, output: Any, reference: Any) -> str:
    """The grader's reason for its score of `output`, where it gives one (`GraderSpec.explain`)."""
    reason: Callable[[Any, Any], str] | None = getattr(grader, "explain", None)
    return reason(output, reference) if reason is not None else ""


def describe_outputs(samples: Sequence[GradedSample]) -> str:
    """A clause quoting what the graded outputs looked like, for the no-signal stop."""
    if not samples:
        return ""
    quoted = "; ".join(
        f"{_cut(sample.text, 80)!r}" + (f" ({_cut(sample.detail, 120)})" if sample.detail else "") for sample in samples
    )
    return f"; the graded outputs read like: {quoted}"


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
