"""Prices, and what work costs: the price table, the cost of usage, and estimates of jobs.

**Prices.** One row of `prices` per base (operators: `mint admin prices set`), in USD per
million tokens trained, sampled and served, and per GPU-hour of full-parameter training. A base
without a row is priced at `DEFAULT_PRICES`. A usage record keeps its cost at the price of its
day (`record_usage`), so a change of the table rewrites no bill; what a job or an eval run cost
is the sum of its records.

**Estimates.** A job is estimated before it runs (`POST /v1/fine_tuning/jobs/estimate`, and at
create, where spend limits are checked against it): tokens trained and sampled, seconds and
dollars. Two figures come from a heuristic on the request alone, the *raw* tokens of each stage:

- SFT and DPO: steps x batch x the training file's mean bytes per row of assistant turns (the
  part loss is put on, counted at upload) / `BYTES_PER_TOKEN`;
- RL: steps x prompts per step x group size x `max_tokens` sampled (an upper bound), trained alike.

The cost model then calibrates them on what this deployment's workers measured: for each base
and method, the last `CALIBRATION_JOBS` single-stage jobs that succeeded (those on the same
training file, where there are any) give the ratio of the tokens they really trained (and
sampled) to their own raw figures, and how long they ran (claim to finish, less loading the
base) as a fixed part plus tokens per second (`_speed`). A base and method no job has finished
on yet use the raw figures and `DEFAULT_TOKENS_PER_SECOND`; the estimate says which
(`calibrated_on`: how many jobs). Each job stores its estimate in its spec's `estimate` (`JobSpec`), so
`estimate_errors` can compare it with what the job cost.

**Ranges.** Every estimate also gives a range of seconds and dollars and its `basis`, so that a
guess reads as one. Uncalibrated, the range is wide (`UNCALIBRATED_TIME`, `UNCALIBRATED_TOKENS`,
and the part of each row that is not trained on, `StageWork.work_ratio`); calibrated, it is the
spread of what the calibrating jobs really took against what the cost model says of them
(`Calibration.time_spread`, `token_spread`), never narrower than `MIN_CALIBRATED_SPREAD`. A
running job then corrects its own figure from its measured steps (`mint.services.jobs.views`).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.schemas.job_spec import JobSpec, PublicEstimate
from mint.schemas.plans import TrainingPlan
from mint.storage.tables import BaseModelRow, Dataset, EvalRun, Price, TrainingJob, UsageRecord, utcnow

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 4.0  # the raw heuristic's bytes of JSONL per token (English text, BPE)
# Before any job of a base and method finished here: a job's fixed cost (open a session, save
# the adapter) and its trained tokens per second, as a small base on CPU runs them.
DEFAULT_OVERHEAD_S = 3.0
DEFAULT_TOKENS_PER_SECOND = 100.0
CALIBRATION_JOBS = 20
# The range of an uncalibrated estimate, as factors of its point figure. Time: the defaults
# above are a small base on an idle CPU, while a worker may be a larger base, a machine busy
# with other work, or a GPU; a demo job estimated at 20 s took 27 minutes on 2 loaded cores (x80:
# its rows' prompts, which the heuristic does not count, a larger base, and the machine's load),
# so x0.5..x20, the high end times the stage's `work_ratio` (its rows' bytes per trained byte).
# Tokens: `BYTES_PER_TOKEN` holds for English prose; code, other languages and chat-template
# tokens range from 2 to 8 bytes a token, so x0.5..x2.
UNCALIBRATED_TIME = (0.5, 20.0)
UNCALIBRATED_TOKENS = (0.5, 2.0)
# The narrowest calibrated range: one job's own noise (a busy machine, a slower save) is about
# +-25% on the CPUs measured here, so even jobs that all fit the model exactly give x0.8..x1.25.
MIN_CALIBRATED_SPREAD = 1.25
# ... once it rests on WELL_CALIBRATED_JOBS jobs on the same training file. On fewer, or on jobs
# of other files (whose prompts may be far longer for what they train), at least x0.5..x2: one
# or two jobs on short rows estimated a job on long rows x8.7 too high on this machine.
WELL_CALIBRATED_JOBS = 5
FEW_JOBS_SPREAD = 2.0
BASIS_UNCALIBRATED = "uncalibrated: the platform's defaults"
BASIS_MEASURED = "measured: this job's first steps"


def basis_of(calibrated_on: int) -> str:
    """What an estimate made with `calibrated_on` finished jobs rests on, in words."""
    if calibrated_on <= 0:
        return BASIS_UNCALIBRATED
    return f"calibrated on {calibrated_on} finished job{'s' if calibrated_on != 1 else ''} of this base and method"


MAX_PRICE = 1_000_000.0


@dataclass(frozen=True)
class Prices:
    """USD per million tokens trained, sampled and served, and per GPU-hour (full-parameter)."""

    trained: float
    sampled: float
    served: float
    gpu_hour: float

    def of(self, kind: str, tokens: int) -> float:
        """What `tokens` of usage `kind` (trained | sampled | served) cost; for `device_seconds`
        (full-parameter training), `tokens` is seconds, priced by the GPU-hour."""
        if kind == "device_seconds":
            return self.device_seconds(tokens)
        rate: float = getattr(self, kind)
        return tokens * rate / 1e6

    def device_seconds(self, seconds: float) -> float:
        """What `seconds` of full-parameter training on one device cost."""
        return seconds * self.gpu_hour / 3600


# Close to what hosted LoRA fine-tuning of a small base costs; operators set their own.
DEFAULT_PRICES = Prices(trained=0.40, sampled=0.20, served=0.20, gpu_hour=2.50)
PRICE_FIELDS = ("trained", "sampled", "served", "gpu_hour")


def prices_for(session: Session, base_model: str) -> Prices:
    row = session.get(Price, base_model)
    if row is None:
        return DEFAULT_PRICES
    return Prices(
        row.usd_per_million_trained, row.usd_per_million_sampled, row.usd_per_million_served, row.usd_per_gpu_hour
    )


def price_table(session: Session) -> list[tuple[str, Prices, bool]]:
    """(base, its prices, whether they are the defaults) for every enabled base."""
    bases = session.execute(select(BaseModelRow.name).where(BaseModelRow.enabled).order_by(BaseModelRow.name))
    rows = {row.base_model: row for row in session.execute(select(Price)).scalars()}
    return [(name, prices_for(session, name), name not in rows) for name in bases.scalars()]


def set_prices(session: Session, base_model: str, changes: dict[str, float | None]) -> Prices:
    """Set some prices of a base (None for all: back to the defaults), logged. Operators only
    (`mint admin prices set`, with database access): prices are the platform's, no API key's."""
    if session.get(BaseModelRow, base_model) is None:
        raise InvalidRequest(f"no base model {base_model!r}; list them with `mint admin models list`", param="base")
    for name, value in changes.items():
        if name not in PRICE_FIELDS:
            raise InvalidRequest(f"unknown price {name!r}; use one of {', '.join(PRICE_FIELDS)}", param=name)
        if value is not None and not 0 <= value <= MAX_PRICE:
            raise InvalidRequest(f"a price is USD from 0 to {MAX_PRICE:g}, not {value}", param=name)
    before = prices_for(session, base_model)
    row = session.get(Price, base_model)
    if all(value is None for value in changes.values()):
        if row is not None:
            session.delete(row)
    else:
        after = {name: changes.get(name, getattr(before, name)) for name in PRICE_FIELDS}
        if row is None:
            row = Price(base_model=base_model)
            session.add(row)
        row.usd_per_million_trained, row.usd_per_million_sampled = after["trained"], after["sampled"]
        row.usd_per_million_served, row.usd_per_gpu_hour = after["served"], after["gpu_hour"]
        row.updated_at = utcnow()
    session.flush()
    now = prices_for(session, base_model)
    log.info("prices of %s set: %s -> %s", base_model, asdict(before), asdict(now))
    return now


# ---- what work cost ----------------------------------------------------------------------------


def resource_cost(session: Session, resource_type: str, resource_id: str) -> float:
    """The cost of a job's or an eval run's usage records, each at the price of its day."""
    query = select(func.coalesce(func.sum(UsageRecord.cost_usd), 0.0)).where(
        UsageRecord.resource_type == resource_type, UsageRecord.resource_id == resource_id
    )
    return float(session.execute(query).scalar_one())


def eval_cost(session: Session, run: EvalRun) -> float:
    return resource_cost(session, "eval_run", run.id)


def spent_since(session: Session, organization_id: str, since: datetime) -> float:
    query = select(func.coalesce(func.sum(UsageRecord.cost_usd), 0.0)).where(
        UsageRecord.organization_id == organization_id, UsageRecord.created_at >= since
    )
    return float(session.execute(query).scalar_one())


# ---- estimates -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageWork:
    """What the heuristic expects one stage to process, before calibration."""

    method: str
    training_file: str
    steps: int
    raw_trained_tokens: float
    raw_sampled_tokens: float
    # The file's bytes per byte trained on (>= 1): a step runs its rows' prompts too, which the
    # heuristic does not count, so an uncalibrated time may be this much longer.
    work_ratio: float = 1.0


# The tokens an online RL job assumes of each live episode before it has seen any.
ONLINE_EPISODE_TOKENS = 256


def stage_work(plan: TrainingPlan, training: Dataset | None) -> StageWork:
    """The raw tokens of one stage: its plan and its training file's size (an online RL stage,
    with no file: its episodes at `ONLINE_EPISODE_TOKENS` each, sampled by the deployment and so
    only trained here)."""
    if plan.method == "online_rl" or training is None:
        trained = float(plan.steps * plan.batch_size * ONLINE_EPISODE_TOKENS)
        return StageWork("rl", "", plan.steps, trained, 0.0)
    if plan.method == "rl":
        sampled = float(plan.steps * plan.batch_size * plan.group_size * plan.max_tokens)
        return StageWork("rl", training.id, plan.steps, sampled, sampled)
    # The bytes loss is put on (assistant turns), counted at upload; the whole file for a dataset
    # stored before that was counted.
    row_bytes = training.validation_report.get("trained_bytes") or training.size_bytes
    row_tokens = row_bytes / max(training.row_count, 1) / BYTES_PER_TOKEN
    work_ratio = max(1.0, training.size_bytes / row_bytes) if row_bytes else 1.0
    trained = plan.steps * plan.batch_size * row_tokens
    return StageWork(plan.method, training.id, plan.steps, trained, 0.0, work_ratio)


@dataclass(frozen=True)
class Calibration:
    """Measured ratios of a base and method: actual to raw tokens, and tokens per second."""

    jobs: int
    trained_ratio: float
    sampled_ratio: float
    overhead_s: float
    tokens_per_second: float
    # (low, high) factors of an estimate's seconds and tokens: the spread, over the calibrating
    # jobs, of what each really took to what this calibration says of it
    time_spread: tuple[float, float] = UNCALIBRATED_TIME
    token_spread: tuple[float, float] = UNCALIBRATED_TOKENS


UNCALIBRATED = Calibration(
    jobs=0,
    trained_ratio=1.0,
    sampled_ratio=1.0,
    overhead_s=DEFAULT_OVERHEAD_S,
    tokens_per_second=DEFAULT_TOKENS_PER_SECOND,
)


def spread(ratios: Sequence[float], floor: float = MIN_CALIBRATED_SPREAD) -> tuple[float, float]:
    """(low, high) factors that cover every ratio of actual to predicted in `ratios`, and at
    least 1/`floor`..`floor`."""
    ratios = [ratio for ratio in ratios if ratio > 0]
    low = min([*ratios, 1 / floor])
    high = max([*ratios, floor])
    return low, high


def calibration(
    session: Session, base_model: str, method: str, training_file: str | None = None, training_type: str = "lora"
) -> Calibration:
    """Ratios from the last `CALIBRATION_JOBS` single-stage jobs of this base, method and training
    type (LoRA and full-parameter steps run at different speeds) that succeeded with an estimate
    on record; those on the same training file, where there are any (how much of a row is trained
    on varies from file to file). Time is the median of the jobs' tokens per second: the one job
    that also loaded the base does not skew it."""
    query = (
        select(TrainingJob)
        .where(
            TrainingJob.base_model == base_model,
            TrainingJob.method == method,
            TrainingJob.status == "succeeded",
            TrainingJob.started_at.is_not(None),
        )
        .order_by(TrainingJob.finished_at.desc())
        .limit(CALIBRATION_JOBS * 4)
    )
    read = ((job, JobSpec.model_validate(job.spec)) for job in session.execute(query).scalars())
    # (job, its spec, its estimate) of each job that calibrates
    measured = [
        (job, spec, spec.estimate)
        for job, spec in read
        if spec.estimate is not None and _calibrates(job, spec) and spec.training_type == training_type
    ]
    same_file = [entry for entry in measured if entry[0].training_dataset_id == training_file]
    measured = (same_file or measured)[:CALIBRATION_JOBS]
    floor = MIN_CALIBRATED_SPREAD if len(same_file) >= WELL_CALIBRATED_JOBS else FEW_JOBS_SPREAD
    if not measured:
        return UNCALIBRATED
    raw_trained = sum(estimate.raw_trained_tokens for _, _, estimate in measured)
    raw_sampled = sum(estimate.raw_sampled_tokens for _, _, estimate in measured)
    trained = sum(job.trained_tokens for job, _, _ in measured)
    sampled = sum(job.sampled_tokens for job, _, _ in measured)
    overhead_s, tokens_per_second = _speed([(job.trained_tokens, _seconds(job, spec)) for job, spec, _ in measured])
    trained_ratio = trained / raw_trained if raw_trained else 1.0
    # how far each job was from this calibration: its seconds to the model's, its tokens to the pooled ratio's
    time_ratios = [
        _seconds(job, spec) / (overhead_s + job.trained_tokens / tokens_per_second) for job, spec, _ in measured
    ]
    token_ratios = [
        job.trained_tokens / (estimate.raw_trained_tokens * trained_ratio)
        for job, _, estimate in measured
        if estimate.raw_trained_tokens > 0 and trained_ratio > 0
    ]
    return Calibration(
        jobs=len(measured),
        trained_ratio=trained_ratio,
        sampled_ratio=sampled / raw_sampled if raw_sampled else 1.0,
        overhead_s=overhead_s,
        tokens_per_second=tokens_per_second,
        time_spread=spread(time_ratios, floor),
        token_spread=spread(token_ratios, floor),
    )


def _speed(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(seconds a job takes besides its tokens, tokens per second) from (tokens, seconds) of
    finished jobs: a least-squares line once three jobs of different sizes have run (small jobs
    are mostly opening a session and saving an adapter), else the median speed alone."""
    points = [(tokens, seconds) for tokens, seconds in points if seconds > 0 and tokens > 0]
    if not points:
        return DEFAULT_OVERHEAD_S, DEFAULT_TOKENS_PER_SECOND
    if len(points) >= 3 and len({tokens for tokens, _ in points}) >= 2:
        slope, intercept = statistics.linear_regression([float(t) for t, _ in points], [s for _, s in points])
        if slope > 0 and intercept >= 0:
            return intercept, 1.0 / slope
    return 0.0, statistics.median(tokens / seconds for tokens, seconds in points)


def _calibrates(job: TrainingJob, spec: JobSpec) -> bool:
    """A job (`spec`: its spec) whose figures speak for the cost model: single-stage, estimated,
    run in one attempt."""
    one_attempt = job.attempts == 1 and job.finished_at is not None
    return spec.estimate is not None and not spec.chained and one_attempt and job.trained_tokens > 0


def _seconds(job: TrainingJob, spec: JobSpec | None = None) -> float:
    """Claim to finish, less the time its worker spent loading the base (`spec`: the job's spec,
    if read already)."""
    assert job.started_at is not None and job.finished_at is not None
    spec = JobSpec.model_validate(job.spec) if spec is None else spec
    elapsed = (job.finished_at - job.started_at).total_seconds() - spec.base_load_seconds
    return max(elapsed, 0.0)


@dataclass(frozen=True)
class JobEstimate:
    """What a job is expected to use and cost; the raw figures are kept to calibrate later."""

    trained_tokens: int
    sampled_tokens: int
    steps: int
    seconds: float
    cost_usd: float
    calibrated_on: int  # finished jobs the ratios came from (the fewest of its stages); 0: defaults
    raw_trained_tokens: float
    raw_sampled_tokens: float
    prices: dict[str, float]
    # the range of seconds and dollars, and what the figures rest on (`basis_of`)
    seconds_low: float = 0.0
    seconds_high: float = 0.0
    cost_usd_low: float = 0.0
    cost_usd_high: float = 0.0
    basis: str = BASIS_UNCALIBRATED

    def public(self) -> PublicEstimate:
        """The figures a client sees (`PUBLIC_ESTIMATE`), seconds to a tenth, dollars to a micro-dollar."""
        return PublicEstimate(
            trained_tokens=self.trained_tokens,
            sampled_tokens=self.sampled_tokens,
            steps=self.steps,
            seconds=round(self.seconds, 1),
            cost_usd=round(self.cost_usd, 6),
            calibrated_on=self.calibrated_on,
            seconds_low=round(self.seconds_low, 1),
            seconds_high=round(self.seconds_high, 1),
            cost_usd_low=round(self.cost_usd_low, 6),
            cost_usd_high=round(self.cost_usd_high, 6),
            basis=self.basis,
        )


def estimate_stages(
    session: Session, base_model: str, stages: Sequence[StageWork], *, training_type: str = "lora"
) -> JobEstimate:
    """A LoRA job costs its tokens trained and sampled; a full-parameter one (`training_type`
    full) the seconds it is expected to hold its device, at the GPU-hour price. The range sums
    each stage's low and high figures: its calibration's spreads (`Calibration`), and for an
    uncalibrated stage the part of its rows the heuristic leaves out (`StageWork.work_ratio`)."""
    prices = prices_for(session, base_model)
    # (point, low, high) of trained and sampled tokens, and of seconds
    trained, sampled, seconds = [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]
    calibrated_on: int | None = None
    for stage in stages:
        model = calibration(session, base_model, stage.method, stage.training_file, training_type)
        stage_trained = stage.raw_trained_tokens * model.trained_ratio
        stage_sampled = stage.raw_sampled_tokens * model.sampled_ratio
        stage_seconds = model.overhead_s + stage_trained / model.tokens_per_second
        time_low, time_high = model.time_spread
        if model.jobs == 0:
            time_high *= stage.work_ratio
        for figures, point, (low, high) in (
            (trained, stage_trained, model.token_spread),
            (sampled, stage_sampled, model.token_spread),
            (seconds, stage_seconds, (time_low, time_high)),
        ):
            figures[0] += point
            figures[1] += point * low
            figures[2] += point * high
        calibrated_on = model.jobs if calibrated_on is None else min(calibrated_on, model.jobs)

    def cost(index: int) -> float:
        # to the micro-dollar, as shown: a budget copied from an estimate covers it
        if training_type == "full":
            return round(prices.device_seconds(seconds[index]), 6)
        return round(prices.of("trained", round(trained[index])) + prices.of("sampled", round(sampled[index])), 6)

    return JobEstimate(
        trained_tokens=round(trained[0]),
        sampled_tokens=round(sampled[0]),
        steps=sum(stage.steps for stage in stages),
        seconds=seconds[0],
        cost_usd=cost(0),
        calibrated_on=calibrated_on or 0,
        raw_trained_tokens=sum(stage.raw_trained_tokens for stage in stages),
        raw_sampled_tokens=sum(stage.raw_sampled_tokens for stage in stages),
        prices=asdict(prices),
        seconds_low=seconds[1],
        seconds_high=seconds[2],
        cost_usd_low=cost(1),
        cost_usd_high=cost(2),
        basis=basis_of(calibrated_on or 0),
    )


@dataclass(frozen=True)
class EstimateError:
    """How far one finished job's estimate was from what it used and cost."""

    job_id: str
    base_model: str
    method: str
    calibrated_on: int
    estimated_usd: float
    actual_usd: float
    estimated_tokens: int
    actual_tokens: int
    estimated_seconds: float
    actual_seconds: float

    @property
    def cost_error(self) -> float:
        """Relative error of the cost: (estimate - actual) / actual."""
        return (self.estimated_usd - self.actual_usd) / self.actual_usd if self.actual_usd else 0.0

    @property
    def seconds_error(self) -> float:
        return (self.estimated_seconds - self.actual_seconds) / self.actual_seconds if self.actual_seconds else 0.0


def estimate_errors(session: Session, *, limit: int) -> list[EstimateError]:
    """Estimate against outcome for the newest `limit` succeeded jobs with an estimate on record."""
    query = select(TrainingJob).where(TrainingJob.status == "succeeded").order_by(TrainingJob.finished_at.desc())
    errors = []
    for job in session.execute(query.limit(limit)).scalars():
        spec = JobSpec.model_validate(job.spec)
        estimate = spec.estimate
        if job.status != "succeeded" or estimate is None or job.started_at is None or job.finished_at is None:
            continue
        errors.append(
            EstimateError(
                job_id=job.id,
                base_model=job.base_model,
                method=job.method,
                calibrated_on=estimate.calibrated_on,
                estimated_usd=estimate.cost_usd,
                actual_usd=job.cost_usd,
                estimated_tokens=estimate.trained_tokens,
                actual_tokens=job.trained_tokens,
                estimated_seconds=estimate.seconds,
                actual_seconds=_seconds(job, spec),
            )
        )
    return errors
