"""The `spec` of a fine-tuning job's row (`TrainingJob.spec`): what `create_job` recorded of the
request, the plans it resolved, the LoRA options, the warm start and stages, and the estimate;
the worker adds how long it took to load the base (`base_load_seconds`).

Readers validate the row's JSON once per use (`JobSpec.model_validate(job.spec)`) and read
attributes; writers store `spec.stored()`, which keeps the JSON shape the column always had:
the keys a job was given and no others (a job without a warm start has no `from_adapter`
key, one without stages no `stages` key), in the order they were always written.

Rows of every age validate: each key is optional with the default its readers always
assumed (a row from before full-parameter training has no `training_type`: LoRA; one from
before estimates has no `estimate`), and keys this model does not name are kept (`extra`
allowed), so a row written by a newer version survives a read and a write by this one.
Plans stay JSON here (`plan`, each stage's `plan`): the worker validates them into their
typed plans itself (`mint.services.jobs.context.stored_plan`), so that a stored plan which
no longer validates fails its job with a message rather than every read of the row.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from mint.schemas.fine_tuning import TrainingType

# The figures of an estimate a client sees (the job view's `estimate`, the estimate route).
PUBLIC_ESTIMATE = (
    "trained_tokens",
    "sampled_tokens",
    "steps",
    "seconds",
    "cost_usd",
    "calibrated_on",
    "seconds_low",
    "seconds_high",
    "cost_usd_low",
    "cost_usd_high",
    "basis",
)


class PublicEstimate(TypedDict):
    """The figures of an estimate a client sees (`PUBLIC_ESTIMATE`). The range and `basis` are
    null on estimates stored before estimates had them."""

    trained_tokens: int
    sampled_tokens: int
    steps: int
    seconds: float
    cost_usd: float
    calibrated_on: int
    seconds_low: float | None
    seconds_high: float | None
    cost_usd_low: float | None
    cost_usd_high: float | None
    basis: str | None


class _Stored(BaseModel):
    """A document read back from a JSON column: unknown keys are kept, not refused."""

    model_config = ConfigDict(extra="allow")


class FromAdapter(_Stored):
    """The adapter version a warm-started job trains further."""

    ref: str = Field(description="The version as the request named it, resolved: `adapter@version`.")
    adapter_version_id: str = Field(description="The version's id; the version the job makes records it as parent.")


class StoredStage(_Stored):
    """One stage of a chained job."""

    plan: dict[str, Any] = Field(description="The stage's resolved plan (`TrainingPlan` as JSON).")
    training_file: str | None = Field(description="The stage's training dataset id (None: online RL).")
    validation_file: str | None = Field(default=None, description="The stage's validation dataset id, if any.")


class StoredEstimate(_Stored):
    """What the job was estimated to use and cost at create (`pricing.JobEstimate`): the public
    figures, and the raw heuristic figures and prices kept to calibrate later estimates."""

    trained_tokens: int
    sampled_tokens: int
    steps: int
    seconds: float
    cost_usd: float
    calibrated_on: int = Field(description="Finished jobs the ratios came from; 0: the defaults.")
    raw_trained_tokens: float = Field(description="Trained tokens by the heuristic alone, before calibration.")
    raw_sampled_tokens: float = Field(description="Sampled tokens by the heuristic alone, before calibration.")
    prices: dict[str, float] = Field(description="The base's prices at create (`pricing.Prices` as a dict).")
    # Added with ranges; absent (null) on rows stored before.
    seconds_low: float | None = Field(default=None, description="The fewest seconds the job is expected to take.")
    seconds_high: float | None = Field(default=None, description="The most seconds the job is expected to take.")
    cost_usd_low: float | None = Field(default=None, description="The least the job is expected to cost.")
    cost_usd_high: float | None = Field(default=None, description="The most the job is expected to cost.")
    basis: str | None = Field(default=None, description="What the figures rest on (`pricing.basis_of`).")

    def public(self) -> PublicEstimate:
        """The figures a client sees (`PUBLIC_ESTIMATE`), as stored."""
        return PublicEstimate(
            trained_tokens=self.trained_tokens,
            sampled_tokens=self.sampled_tokens,
            steps=self.steps,
            seconds=self.seconds,
            cost_usd=self.cost_usd,
            calibrated_on=self.calibrated_on,
            seconds_low=self.seconds_low,
            seconds_high=self.seconds_high,
            cost_usd_low=self.cost_usd_low,
            cost_usd_high=self.cost_usd_high,
            basis=self.basis,
        )


class JobSpec(_Stored):
    """A fine-tuning job's `spec` column. Fields are declared in the order `create_job` writes them."""

    request: dict[str, Any] = Field(
        default_factory=dict,
        description="The create request's body as given (`FineTuningJobCreate`, JSON, without nulls).",
    )
    request_sha256: str | None = Field(
        default=None, description="SHA-256 of the request body; a retry under the same Idempotency-Key must match it."
    )
    plan: dict[str, Any] = Field(
        default_factory=dict,
        description="The first stage's resolved plan (`TrainingPlan` as JSON; old rows lack its `method`).",
    )
    training_type: TrainingType = Field(default="lora", description="`lora`, or `full`: every weight of the base.")
    lora: dict[str, Any] = Field(
        default_factory=dict, description="The checked LoRA options (`LoraOptions` as JSON, without nulls)."
    )
    adapter_name: str | None = Field(
        default=None, description="The adapter the job registers its version under: its suffix, or `ft-<id>`."
    )
    metadata: dict[str, str] = Field(default_factory=dict, description="The request's metadata (empty: none).")
    from_adapter: FromAdapter | None = Field(default=None, description="The warm start; absent for a fresh adapter.")
    stages: list[StoredStage] | None = Field(default=None, description="Every stage of a chained job; absent if one.")
    estimate: StoredEstimate | None = Field(default=None, description="The estimate at create; absent on old rows.")
    base_load_seconds: float = Field(
        default=0.0, description="Seconds the worker spent loading the base when it started the job (the worker's)."
    )

    @property
    def chained(self) -> bool:
        """Whether the job chains stages (`stages`), rather than training its one `plan`."""
        return self.stages is not None

    @property
    def budget_usd(self) -> float | None:
        """The job's own spend limit, from its request."""
        return self.request.get("budget_usd")

    def stored(self) -> dict[str, Any]:
        """The JSON to store: the keys this spec was given or read with, and no default it was not."""
        return self.model_dump(mode="json", exclude_unset=True)
