"""Wire types of production capture: a deployment's capture settings, captured completions and
the feedback given on them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from mint.schemas.common import ID_PATTERN, LABEL_PATTERN, TEXT_PATTERN, FiniteJson, RequestModel, WireModel

MAX_COMMENT = 10_000
# One feedback is about a message's worth: its score, label, comment and correction, as JSON
# (UTF-8), at most this; more is refused (400) naming the limit. Any key of the organization,
# viewers included, may give feedback, so it is bounded like every other write.
MAX_FEEDBACK_BYTES = 64 * 1024
# Feedback entries one capture keeps; one more is refused (409). Feedback also counts against
# the organization's capture storage quota (`capture_storage_mib`, 429 past it).
MAX_FEEDBACK_PER_CAPTURE = 20


class CaptureSettings(BaseModel):
    """A deployment's capture: the share of its requests recorded (0: none), and for how long."""

    rate: float = Field(description="Share of requests recorded, chosen at random (0: capture is off).")
    retention_days: int = Field(description="Days a capture is kept, then deleted.")
    tokens: bool = Field(
        default=False,
        description="Whether the turns of marked episodes are recorded token-exact (prompt ids, sampled ids, "
        "logprobs): what online RL trains from. Episodes are chosen at `rate`, whole.",
    )


class CaptureUpdate(RequestModel):
    """What to change of a deployment's capture; an absent field is unchanged."""

    model_config = ConfigDict(extra="forbid")

    rate: float | None = Field(default=None, ge=0, le=1, description="Share of requests recorded (0: off).")
    retention_days: int | None = Field(default=None, ge=1, le=3650, description="Days a capture is kept.")
    tokens: bool | None = Field(
        default=None,
        description="Record the turns of marked episodes (header X-Mint-Episode) token-exact, for online RL.",
    )


class FeedbackCreate(RequestModel):
    """Feedback on a captured completion; at least one field. At most 64 KiB of JSON in all
    (MAX_FEEDBACK_BYTES), at most 20 entries per capture (MAX_FEEDBACK_PER_CAPTURE), counted
    against the organization's capture storage quota."""

    model_config = ConfigDict(extra="forbid")

    score: float | None = Field(default=None, ge=0, le=1, description="How good the answer was, 0 to 1.")
    label: str | None = Field(
        default=None, min_length=1, max_length=100, pattern=LABEL_PATTERN, description="e.g. `wrong_tool`."
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT, pattern=TEXT_PATTERN)
    correction: FiniteJson | None = Field(
        default=None,
        description='The answer it should have been: `{"message": {"role": "assistant", ...}}` for a chat '
        'completion, `{"text": ...}` for a text completion. The whole feedback is at most 64 KiB of JSON.',
    )


class FeedbackPublic(WireModel):
    id: str
    object: Literal["capture.feedback"] = "capture.feedback"
    capture_id: str
    score: float | None
    label: str | None
    comment: str | None
    correction: dict[str, Any] | None
    created_by: str
    created_at: datetime


class CapturePublic(WireModel):
    """A captured completion: what was asked, what answered and how, and its feedback."""

    id: str = Field(description="The completion's id (`chatcmpl-...` or `cmpl-...`).")
    object: Literal["capture"] = "capture"
    deployment_id: str
    revision: int
    model: str = Field(
        description="The adapter version (or base) that answered.", validation_alias=AliasChoices("model_ref", "model")
    )
    kind: Literal["chat", "completion"]
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    created_at: datetime
    expires_at: datetime
    feedback: list[FeedbackPublic] = Field(default_factory=list)


class CaptureFilter(RequestModel):
    """Which captures to mine: those with a correction in their feedback, of one deployment (or
    all), in a time window, optionally only those scored at most `max_score` or given `label`."""

    model_config = ConfigDict(extra="forbid")

    deployment: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=ID_PATTERN,
        description="The deployment's id or name; none: every one.",
    )
    since: datetime | None = None
    until: datetime | None = None
    max_score: float | None = Field(default=None, ge=0, le=1, description="Only captures scored at most this.")
    label: str | None = Field(
        default=None, max_length=100, pattern=LABEL_PATTERN, description="Only captures given this label."
    )


class DatasetFromCaptures(CaptureFilter):
    kind: Literal["chat", "preference", "prompts"] = Field(
        description="chat: SFT rows ending in the correction; preference: DPO pairs, the correction over what "
        "was served; prompts: RL prompts with the correction as reference (graded `normalized`)."
    )
    filename: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class BenchmarkFromCaptures(CaptureFilter):
    split: str = Field(
        default="production", min_length=1, max_length=50, pattern=LABEL_PATTERN, description="The new tasks' split."
    )
