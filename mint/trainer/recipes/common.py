"""What the recipes share: the trainer they drive, the per-step report, the callback, and
what a job hands the runner of its method (`RecipeInputs`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mint.errors import InvalidRequest
from mint.trainer.data import learning_rate_at
from mint.trainer.types import AdamParams, Datum, ForwardOutput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from mint.trainer.episodes import Env
    from mint.trainer.training_session import TrainingSession

Rendered = TypeVar("Rendered")


class Trainer(Protocol):
    """The primitives a recipe needs: a LoRA session or a full-parameter trainer."""

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput: ...

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]: ...


class Scorer(Protocol):
    """Log-probabilities (and a loss's value) without a gradient: a session, or the base."""

    def forward(
        self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput: ...


@dataclass(frozen=True)
class StepReport:
    """One optimizer step: its number (1-based), the learning rate, and metrics such as loss; an
    RL step also carries a few of its samples as graded (`mint.trainer.recipes.graded_samples`)."""

    step: int
    learning_rate: float
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)


# Called after every optimizer step; returning False stops the recipe (a cancelled job).
OnStep = Callable[[StepReport], bool | None]


class Schedule(Protocol):
    """The learning-rate fields a recipe config carries."""

    steps: int
    learning_rate: float
    warmup_steps: int
    lr_schedule: str


def scheduled_learning_rate(config: Schedule, step: int) -> float:
    """The learning rate of 0-based `step` under the config's warm-up and schedule."""
    return learning_rate_at(
        step,
        peak=config.learning_rate,
        steps=config.steps,
        warmup_steps=config.warmup_steps,
        schedule=config.lr_schedule,
    )


def trained_token_count(batch: Sequence[Datum]) -> int:
    """Tokens of a batch that carry loss weight: what a step of SFT or DPO trains on (and bills)."""
    return sum(1 for datum in batch for weight in datum.loss_fn_inputs["weights"] if weight > 0)


def keep_going(on_step: OnStep | None, report: StepReport) -> bool:
    return on_step is None or on_step(report) is not False


class Grader(Protocol):
    """Scores an output against a prompt's reference, in [0, 1]: a completion's text, or the
    messages a multi-turn episode added (assistant turns and observations, in order); less the
    spec's penalties for `steps` (model turns) and `tokens` (generated), if it has any.

    Jobs pass the benchmark graders' `mint.evals.graders.GraderSpec`, so RL rewards are the
    scores benchmarks give; the recipe depends only on this method, never on evals. A grader
    that also reads the prompt (a `remote` one, which sends it to a reward endpoint) has
    `for_row(row) -> Grader`, which the recipe calls for each prompt row; `explain(output,
    reference) -> str`, where present, is its reason for a score.
    """

    def reward(self, output: Any, reference: Any, *, steps: int = 1, tokens: int = 0) -> float: ...


def _no_graders(spec: dict[str, Any]) -> Grader:
    raise InvalidRequest("this job's method has no grader registry to build a reward from", param="grader")


def _no_environments(row: Mapping[str, Any], job_environment: Mapping[str, Any] | None) -> Callable[[], Env] | None:
    if job_environment is not None or row.get("environment") or row.get("tools"):
        raise InvalidRequest("this job's runner has no environments to run tool episodes in", param="environment")
    return None


# (prompt row, the plan's environment spec) -> what makes a fresh environment per episode, or None.
EnvironmentFor = Callable[[Mapping[str, Any], Mapping[str, Any] | None], Callable[[], "Env"] | None]

DEFAULT_RL_MAX_STEPS_WITHOUT_SIGNAL = 5


@dataclass(frozen=True)
class LiveSource:
    """An online RL job's link to its deployment, given by the job (the trainer reads no
    database): the feed of rewarded episodes (`mint.trainer.recipes.online_rl.EpisodeFeed`),
    what publishes the policy's weights as a served version, the version the job started from,
    and the versions an earlier attempt published (with the steps after which each was current)."""

    feed: Any
    publish: Callable[[int], str]
    start_version: str | None
    earlier_versions: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeInputs:
    """What a job gives the runner of its method (`mint.trainer.methods`), besides the plan:
    the session to train, the base's tokenizer, the base itself as a reference scorer (the
    KL penalty of RL), the training file's rows, the job's seed, the step to start from (that
    of the checkpoint a resumed job loaded), and, for methods with rewards, the grader of a
    plan's grader spec (the benchmarks' closed registry, given by the caller so that the
    trainer never imports evals), the environments RL episodes act in (`environment_for`, also
    the caller's: evals' scripted tools and registered Python environments), and the worker's
    default patience of RL without signal."""

    training: TrainingSession
    tokenizer: PreTrainedTokenizerBase
    reference: Scorer
    rows: Sequence[Mapping[str, Any]]
    seed: int
    start_step: int = 0
    on_step: OnStep | None = None
    grader_for: Callable[[dict[str, Any]], Grader] = _no_graders
    environment_for: EnvironmentFor = _no_environments
    # RL stops after this many steps in a row without reward signal, unless the plan says otherwise.
    rl_max_steps_without_signal: int = DEFAULT_RL_MAX_STEPS_WITHOUT_SIGNAL
    # An online RL job's deployment (its episodes, its versions); None for methods with rows.
    live: LiveSource | None = None


def render_rows(rows: Sequence[Mapping[str, Any]], render: Callable[[Mapping[str, Any]], Rendered]) -> list[Rendered]:
    """Render every row of a training file, naming its line when the base's chat template refuses it."""
    rendered = []
    for index, row in enumerate(rows):
        try:
            rendered.append(render(row))
        except InvalidRequest as exc:
            raise InvalidRequest(f"line {index + 1}: {exc.message}", param=exc.param) from None
    return rendered
