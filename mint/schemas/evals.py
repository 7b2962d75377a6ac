"""Wire types for benchmarks, their versions, eval runs, trajectories and comparisons.

Request bodies are checked for shape here; what depends on content (a task's fields, a
grader's options, which split exists) is checked by the services, whose errors name the line
and the field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from mint.schemas.common import ID_PATTERN, MAX_SEED, MAX_VERSION, FiniteJson, Page, RequestModel, WireModel
from mint.schemas.datasets import DatasetPublic

BenchmarkFormat = Literal["jsonl", "yaml"]
BuiltinName = Literal["arithmetic", "format", "tool_calling", "triage"]
BuiltinSplit = Literal["train", "heldout"]
EvalStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
MinedKind = Literal["chat", "preference", "prompts"]


def _utc(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns; every time Mint stores is UTC.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(_utc)]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
SPLIT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# Benchmark content travels in a JSON body; larger benchmarks are split into several.
MAX_CONTENT_CHARS = 32 * 1024 * 1024
MAX_BUILTIN_TASKS = 10_000

BenchmarkName = Annotated[
    str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN, description="Unique in the organization.")
]
ResourceId = Annotated[str, Field(min_length=1, max_length=100, pattern=ID_PATTERN)]


class _Request(RequestModel):
    model_config = ConfigDict(extra="forbid")


class RewardPenalties(BaseModel):
    """Costs for effort, subtracted from a grader's score when it is used as a reward.

    reward = score - step * max(0, steps - free_steps) - token * max(0, tokens - free_tokens),
    floored at 0 unless `allow_negative`. The floor is the default because a penalty should
    rank answers of equal merit, cheapest first, not make one wrong answer better than another
    for being shorter: below 0 the cheapest way to a higher reward is to fail quickly.
    `allow_negative` keeps the full difference (group-normalised RL advantages do not care
    about the sign), for a task where every extra step or token is itself the failure.
    Benchmarks' scores and pass rates never include penalties: they shape rewards only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    step: float = Field(default=0.0, ge=0.0, le=1.0, description="Subtracted per step beyond `free_steps`.")
    token: float = Field(default=0.0, ge=0.0, le=0.01, description="Subtracted per token beyond `free_tokens`.")
    free_steps: int = Field(default=1, ge=0, le=1000, description="Steps (model turns) that cost nothing.")
    free_tokens: int = Field(default=0, ge=0, le=1_000_000, description="Generated tokens that cost nothing.")
    allow_negative: bool = Field(default=False, description="Let the reward go below 0 (RL only).")


class GraderSpecIn(_Request):
    """A grader of Mint's closed registry: exact, normalized, regex, json_match, numeric, tool_call, python,
    judge, composite; with optional reward `penalties` for steps and tokens."""

    type: str = Field(min_length=1, max_length=50, description="The grader, e.g. `numeric`.")
    config: FiniteJson = Field(default_factory=dict, description='Its options, e.g. `{"abs_tol": 0.01}`.')
    penalties: RewardPenalties | None = Field(
        default=None, description="Step and token costs subtracted from the score when it is an RL reward."
    )


class BenchmarkSource(_Request):
    """Where a version's tasks come from: uploaded `content`, a built-in benchmark, or both.

    Every field is optional here; the service says which are missing, so that the answer
    names the field and how to fill it.
    """

    format: BenchmarkFormat | None = Field(default=None, description="jsonl | yaml: how `content` is written.")
    content: str | None = Field(
        default=None, max_length=MAX_CONTENT_CHARS, description="The tasks: JSONL lines, or a YAML document."
    )
    dataset_id: ResourceId | None = Field(
        default=None,
        description="The tasks are this uploaded prompts dataset's rows (JSONL or parquet; Mint, TRL, verl or "
        "OpenRLHF rows, stored in Mint's shape), instead of `content`.",
    )
    grader: GraderSpecIn | None = Field(default=None, description="Grader of the tasks that do not name their own.")
    builtin: BuiltinName | None = Field(default=None, description="Import tasks of a built-in benchmark.")
    split: BuiltinSplit | None = Field(
        default=None, description="With `builtin`: import only this split; both (each `n` tasks) if omitted."
    )
    n: int | None = Field(default=None, ge=1, le=MAX_BUILTIN_TASKS, description="With `builtin`: tasks per split.")
    seed: int | None = Field(
        default=None, ge=0, le=MAX_SEED, description="With `builtin`: which tasks are drawn (default 0)."
    )


class BenchmarkCreate(BenchmarkSource):
    """A new benchmark and its version 1."""

    name: BenchmarkName
    description: str = Field(default="", max_length=2000)


class BenchmarkVersionCreate(BenchmarkSource):
    """A new version of a benchmark; or, with `replace_latest`, new tasks for the newest version
    if no eval run has used it yet (a used version never changes)."""

    replace_latest: bool = Field(default=False, description="Replace the newest version's tasks while unused.")


class BenchmarkVersionPublic(WireModel):
    """An immutable set of tasks, named by the sha256 of its canonical form."""

    id: str
    object: Literal["benchmark.version"] = "benchmark.version"
    benchmark_id: str
    version: int
    sha256: str
    task_count: int
    splits: dict[str, int] = Field(description="Tasks per split label.")
    grader: dict[str, Any] = Field(description="The benchmark-level grader ({} when every task names its own).")
    locked_at: Timestamp | None = Field(description="When an eval run first used it; from then on it never changes.")
    created_at: Timestamp


class BenchmarkPublic(WireModel):
    id: str
    object: Literal["benchmark"] = "benchmark"
    name: str
    description: str
    created_at: Timestamp
    latest_version: BenchmarkVersionPublic | None = None


class EvalRunCreate(_Request):
    """Evaluate a model on a benchmark version."""

    benchmark_id: ResourceId
    version: int | None = Field(
        default=None, ge=1, le=MAX_VERSION, description="The benchmark version; the newest if omitted."
    )
    model: str = Field(
        min_length=1,
        max_length=300,
        pattern=ID_PATTERN,
        description="A base model (`tiny-glm-moe`) or an adapter version (`my-adapter@3`).",
    )
    split: str | None = Field(
        default=None, max_length=50, pattern=SPLIT_PATTERN, description="Only the tasks of this split; all if omitted."
    )
    max_tokens: int = Field(default=256, ge=1, le=8192, description="Largest assistant turn, in tokens.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0 decodes greedily.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Sampling seed: the same seed gives the same samples.")
    max_steps: int = Field(default=8, ge=1, le=64, description="Most assistant turns per task (tool tasks).")


class EvalRunPublic(BaseModel):
    id: str
    object: Literal["eval.run"] = "eval.run"
    benchmark_id: str
    benchmark_version_id: str
    version: int
    model: str
    base_model: str
    adapter_version_id: str | None
    split: str | None
    status: EvalStatus
    config: dict[str, Any]
    metrics: dict[str, Any] = Field(
        description="accuracy, mean_score, passed, tasks, errors, mean_steps, mean_tokens_in, mean_tokens_out, "
        "mean_latency_ms, tasks_per_s (when finished); capacity_waits and waiting_for_capacity (why and until "
        "when) while a queued run waits for a worker with a free LoRA session slot."
    )
    tasks_done: int = Field(default=0, description="Tasks whose trajectory is written: the run's progress.")
    attempts: int = Field(
        default=0,
        description="Times a worker has claimed the run; past MINT_MAX_ATTEMPTS it fails with its last error.",
    )
    error: dict[str, Any] | None
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None


class TrajectoryPublic(WireModel):
    """One task of one run: the whole conversation (tool calls and results included) and its grade."""

    id: str
    object: Literal["eval.trajectory"] = "eval.trajectory"
    eval_run_id: str
    task_id: str
    messages: list[Any]
    output: str
    score: float
    passed: bool
    steps: int
    tokens_in: int
    tokens_out: int
    latency_ms: float
    error: str | None
    grade: dict[str, Any] | None = Field(
        default=None,
        description="How the grader reached its score: its detail, a composite's parts, a judge's prompt and reply.",
    )
    routes: list[dict[str, Any]] | None = Field(
        default=None,
        description="An eval of a mixture deployment: for each step, the adapter the router chose (`adapter`) "
        "and its decision (`route`: `decided_by`, `detail`, ...).",
    )
    created_at: Timestamp


class RunSidePublic(BaseModel):
    run_id: str
    accuracy: float
    mean_score: float
    mean_steps: float
    mean_tokens_in: float
    mean_tokens_out: float
    mean_latency_ms: float


class IntervalPublic(BaseModel):
    low: float
    high: float
    confidence: float
    resamples: int
    seed: int


class ComparisonPublic(BaseModel):
    """Run B against run A, task by task, on one benchmark version."""

    object: Literal["eval.comparison"] = "eval.comparison"
    benchmark_version_id: str
    a: RunSidePublic
    b: RunSidePublic
    tasks: int
    only_in_a: int
    only_in_b: int
    fixed: list[str]
    broken: list[str]
    still_passing: list[str]
    still_failing: list[str]
    accuracy_delta: float = Field(description="B's accuracy minus A's.")
    interval: IntervalPublic = Field(description="Paired bootstrap confidence interval of accuracy_delta.")
    significant: bool
    mean_score_delta: float
    efficiency_delta: dict[str, float]


class FromFailuresCreate(_Request):
    """Mine a run's failed trajectories into a dataset."""

    eval_id: ResourceId
    kind: MinedKind = Field(
        description="chat: SFT rows with the reference answer; preference: DPO pairs, reference over the model's "
        "output; prompts: RL prompts with reference and grader."
    )
    filename: str | None = Field(default=None, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SkippedTask(BaseModel):
    task_id: str
    reason: str


class MinedDatasetPublic(DatasetPublic):
    """The dataset mined from a run's failures, and the failed tasks that gave no row, with why."""

    failed_tasks: int = Field(description="Failed trajectories of the run.")
    skipped: list[SkippedTask] = Field(description="Failed tasks that gave no valid row.")


BenchmarkPage = Page[BenchmarkPublic]
BenchmarkVersionPage = Page[BenchmarkVersionPublic]
EvalRunPage = Page[EvalRunPublic]
TrajectoryPage = Page[TrajectoryPublic]
