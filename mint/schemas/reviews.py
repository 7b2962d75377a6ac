"""Wire types of expert review: queues, their items, reviews, agreement, and a run read with
expert verdicts.

A queue is made from one source (an eval run's trajectories, or a deployment's captures) and
filters; each item keeps a snapshot of what a reviewer reads (`ItemSnapshot`). A review gives
a verdict (`passed` and/or `score`), marks per rubric criterion where the task has a rubric,
a comment, and perhaps a correction: the item's messages from `from_message` on, rewritten.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mint.schemas.common import ID_PATTERN, LABEL_PATTERN, MAX_SEED, TEXT_PATTERN, FiniteJson, RequestModel, WireModel

MAX_QUEUE_ITEMS = 5_000
MAX_REVIEWS_PER_ITEM = 10
MAX_COMMENT = 10_000
MAX_INSTRUCTIONS = 20_000
MAX_CORRECTION_MESSAGES = 100
MAX_RUBRIC_CRITERIA = 50
# One review as JSON (verdict, marks, comment, correction) is at most this: any key of the
# organization may review, so a review is bounded like every write.
MAX_REVIEW_BYTES = 256 * 1024
# Agreement (Krippendorff's alpha) below this flags a grader: 0.667 is the lowest value
# Krippendorff accepts for tentative conclusions.
DEFAULT_AGREEMENT_THRESHOLD = 0.667

QueueSource = Literal["eval_run", "deployment"]
ItemStatus = Literal["all", "todo", "reviewed", "done"]


class _Request(RequestModel):
    model_config = ConfigDict(extra="forbid")


class ScoreBand(_Request):
    """Items whose score lies in [min, max]: the overall grade's, or the part of a composite
    grade whose grader type is `grader` (e.g. `judge`)."""

    min: float = Field(default=0.0, ge=0, le=1)
    max: float = Field(default=1.0, ge=0, le=1)
    grader: str | None = Field(default=None, max_length=50, pattern=ID_PATTERN)


class QueueFilters(_Request):
    """Which items of the source the queue takes; every filter given must hold (AND), then
    `sample_rate` keeps a seeded random share of what is left. Grades are read from what the
    run recorded; captures have no grade, so `failed`, `score` (without a feedback score),
    `disagree_with_run`, `disagree_graders` and `judge_margin` apply to eval runs only."""

    failed: bool | None = Field(default=None, description="true: only failed trajectories; false: only passed ones.")
    score: ScoreBand | None = Field(
        default=None,
        description="A score band: a trajectory's grade (or one grader's part), or a capture's latest feedback score.",
    )
    disagree_with_run: str | None = Field(
        default=None,
        max_length=100,
        pattern=ID_PATTERN,
        description="Another eval run of the same benchmark version: only tasks it graded the other way.",
    )
    disagree_graders: list[str] | None = Field(
        default=None,
        min_length=2,
        max_length=2,
        description="Two grader types of a composite grade (e.g. [`regex`, `judge`]): only items where one passed "
        "and the other did not.",
    )
    judge_margin: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="A judge's low confidence: only items where a judge part gave no verdict, or scored within this "
        "distance of its pass threshold. (A judge records no confidence of its own: its margin is the measure.)",
    )
    label: str | None = Field(
        default=None,
        max_length=100,
        pattern=LABEL_PATTERN,
        description="Eval runs: the task's split; captures: a label given in the capture's feedback.",
    )
    sample_rate: float | None = Field(
        default=None, gt=0, le=1, description="Keep this share of the items that pass the filters, at random."
    )
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="The seed of `sample_rate`'s draw.")


class ReviewQueueCreate(_Request):
    """A queue over one source: `eval_id` (its trajectories) or `deployment` (its captures)."""

    name: str = Field(min_length=1, max_length=200, pattern=LABEL_PATTERN)
    eval_id: str | None = Field(default=None, max_length=100, pattern=ID_PATTERN)
    deployment: str | None = Field(default=None, max_length=200, pattern=ID_PATTERN)
    filters: QueueFilters = Field(default_factory=QueueFilters)
    instructions: str = Field(default="", max_length=MAX_INSTRUCTIONS, pattern=TEXT_PATTERN)
    reviews_per_item: int = Field(
        default=1, ge=1, le=MAX_REVIEWS_PER_ITEM, description="Reviews wanted per item before it is done."
    )
    assignees: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="API key ids to deal the items to in turn (one key per item); empty: every item is open.",
    )
    max_items: int = Field(default=500, ge=1, le=MAX_QUEUE_ITEMS)

    @model_validator(mode="after")
    def _one_source(self) -> ReviewQueueCreate:
        if (self.eval_id is None) == (self.deployment is None):
            raise ValueError("give exactly one source: eval_id (its trajectories) or deployment (its captures)")
        return self


class QueueProgress(BaseModel):
    items: int
    reviewed: int = Field(description="Items with at least one review.")
    done: int = Field(description="Items with `reviews_per_item` reviews.")
    reviews: int
    mine: int = Field(description="Items the caller has reviewed.")
    todo: int = Field(
        description="Items left for the caller: open or assigned to them, not done, not reviewed by them."
    )


class ReviewQueuePublic(WireModel):
    id: str
    object: Literal["review_queue"] = "review_queue"
    name: str
    instructions: str
    source: QueueSource
    eval_run_id: str | None
    deployment_id: str | None
    benchmark_version_id: str | None
    filters: dict[str, Any]
    reviews_per_item: int
    item_count: int
    created_by: str
    created_at: datetime
    progress: QueueProgress | None = None


class ItemSnapshot(BaseModel):
    """What a reviewer reads, as it was when the queue was made: the whole conversation
    (`messages`: the prompt, then the model's turns, tool calls and tool results), where the
    model's part starts (`prompt_length`), the reference, the grade (a composite's parts and a
    judge's prompt and reply included) and the rubric criteria to mark."""

    kind: Literal["trajectory", "capture"]
    task_id: str
    model: str
    messages: list[dict[str, Any]]
    prompt_length: int
    tools: list[dict[str, Any]] | None = None
    environment: Any = Field(
        default=None, description="The task's tool environment as the task holds it (scripted results, or a name)."
    )
    output: str = ""
    reference: Any = None
    solution: list[dict[str, Any]] | None = None
    grader: dict[str, Any] | None = None
    grade: dict[str, Any] | None = None
    graders: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Each grader's verdict: `overall`, then a composite's parts as `<index>:<type>` (a judge with its "
        "model, pass threshold and whether it gave a verdict).",
    )
    score: float | None = None
    passed: bool | None = None
    error: str | None = None
    split: str | None = None
    rubric: list[str] = Field(default_factory=list)
    feedback: list[dict[str, Any]] = Field(default_factory=list, description="A capture's feedback, oldest first.")
    eval_run_id: str | None = None
    deployment_id: str | None = None


class RubricMark(_Request):
    passed: bool | None = None
    score: float | None = Field(default=None, ge=0, le=1)
    note: str | None = Field(default=None, max_length=2_000, pattern=TEXT_PATTERN)


class Correction(_Request):
    """The trajectory it should have been: the item's messages before `from_message` are kept,
    and `messages` (assistant turns, with tool results where the rewrite calls tools) replace
    the rest. `from_message` is the index of a model's (assistant) message: where it went wrong."""

    from_message: int = Field(ge=0, le=100_000)
    messages: list[FiniteJson] = Field(min_length=1, max_length=MAX_CORRECTION_MESSAGES)


class ReviewCreate(_Request):
    """A verdict (`passed`, `score` or both), marks per rubric criterion, a comment, and perhaps
    a correction. A second review of the same item by the same key replaces the first."""

    passed: bool | None = None
    score: float | None = Field(default=None, ge=0, le=1)
    rubric: dict[str, RubricMark] = Field(
        default_factory=dict,
        max_length=MAX_RUBRIC_CRITERIA,
        description="Marks by criterion, each a criterion of the item's `rubric`.",
    )
    comment: str | None = Field(default=None, max_length=MAX_COMMENT, pattern=TEXT_PATTERN)
    correction: Correction | None = None

    @model_validator(mode="after")
    def _has_verdict(self) -> ReviewCreate:
        if self.passed is None and self.score is None:
            raise ValueError("give a verdict: passed (true/false), score (0 to 1), or both")
        return self


class ItemAssign(_Request):
    assignee: str | None = Field(
        max_length=100, pattern=ID_PATTERN, description="An API key id of the organization; null: open to anyone."
    )


class ReviewPublic(WireModel):
    id: str
    object: Literal["review"] = "review"
    item_id: str
    reviewer: str
    reviewer_name: str
    passed: bool | None
    score: float | None
    rubric: dict[str, Any]
    comment: str | None
    correction: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime


class ReviewItemPublic(WireModel):
    id: str
    object: Literal["review_item"] = "review_item"
    queue_id: str
    position: int
    source_id: str
    task_id: str
    assignee_key_id: str | None
    reasons: list[str]
    snapshot: ItemSnapshot
    reviews: list[ReviewPublic] = Field(default_factory=list)
    created_at: datetime


# ---- agreement ---------------------------------------------------------------------------------


class ReviewerAgreement(BaseModel):
    """How reviewers agree on the items two or more of them judged."""

    items: int = Field(description="Items with two or more verdicts.")
    percent_agreement: float | None = Field(description="Share of pairs of verdicts on an item that agree.")
    alpha: float | None = Field(description="Krippendorff's alpha of pass/fail verdicts (nominal).")
    score_alpha: float | None = Field(description="Krippendorff's alpha of scores (interval), where scores were given.")


class PairAgreement(BaseModel):
    a: str
    b: str
    items: int
    percent_agreement: float | None
    alpha: float | None


class GraderAgreement(BaseModel):
    """How one grader of the runs (the overall grade, or a part of a composite grade) agrees
    with the experts' verdict on the items the experts settled."""

    grader: str = Field(description="`overall`, or a composite part as `<index>:<type>`.")
    type: str
    model: str | None = Field(default=None, description="The judge model, for a judge.")
    items: int
    percent_agreement: float | None
    alpha: float | None
    flagged: bool = Field(
        description="Agreement below the threshold (alpha, or the share agreeing where alpha is undefined)."
    )


class AgreementReport(BaseModel):
    object: Literal["review.agreement"] = "review.agreement"
    queue_id: str | None = None
    benchmark_version_id: str | None = None
    threshold: float
    items: int = Field(description="Items with at least one review.")
    reviews: int
    settled: int = Field(description="Items whose reviewers' majority gives an expert verdict (ties are not settled).")
    reviewers: ReviewerAgreement
    pairs: list[PairAgreement]
    graders: list[GraderAgreement]
    flagged_judges: list[str] = Field(
        description="Judge models whose agreement with the experts is below the threshold."
    )


# ---- a run with expert verdicts ----------------------------------------------------------------


class ExpertVerdict(BaseModel):
    passed: bool | None = Field(description="The reviewers' majority; null when they are split evenly.")
    score: float | None = Field(description="The mean of the reviewers' scores, where given.")
    reviews: int
    reviewers: list[str]


class ExpertTrajectory(BaseModel):
    task_id: str
    trajectory_id: str
    grader_passed: bool
    grader_score: float
    expert: ExpertVerdict
    passed: bool = Field(description="The expert verdict where settled, else the grader's.")
    differs: bool = Field(description="The experts settled the other way from the grader.")


class RunWithExperts(BaseModel):
    object: Literal["eval.with_experts"] = "eval.with_experts"
    eval_id: str
    benchmark_version_id: str
    tasks: int
    reviewed: int
    differs: int
    grader_pass_rate: float
    pass_rate: float = Field(description="The pass rate with expert verdicts overriding the grader's where settled.")
    trajectories: list[ExpertTrajectory] = Field(description="The reviewed tasks, both verdicts kept.")


# ---- mining ------------------------------------------------------------------------------------


class DatasetFromReviews(_Request):
    kind: Literal["chat", "preference", "prompts"] = Field(
        description="chat: SFT rows ending in the correction; preference: DPO pairs, the correction over the model's "
        "turn; prompts: RL prompts with the correction's answer as reference."
    )
    filename: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class BenchmarkFromReviews(_Request):
    benchmark_id: str | None = Field(
        default=None,
        max_length=200,
        pattern=ID_PATTERN,
        description="The benchmark to add a version to; default: the benchmark of the queue's eval run.",
    )
    split: str = Field(default="expert", min_length=1, max_length=50, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$")
