"""An auto run's `state` column as a typed record: where the run is and what it has learned.

The driver reads the column once per tick (`AutotuneState.model_validate(run.state)`), changes
the record's fields, and writes it back with `stored()`. The stored JSON keeps its shape: a key
is written only once it has been set (a fresh run's state is `{"phase": "baseline"}`, not twenty
nulls), and keys this version does not know (written by an older Mint, e.g. `base_heldout`)
are kept as they are, so reading and writing a row changes nothing but what the driver changed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

AutotunePhase = Literal["baseline", "search", "final", "done"]


class StoredRecord(BaseModel):
    """A record kept in a JSON column: assignments are validated, unknown keys are kept, and only
    the keys ever set are written back."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    def stored(self) -> dict[str, Any]:
        """The JSON to store: the keys that were read or set, as they were given."""
        return self.model_dump(mode="json", exclude_unset=True)


class AutotuneBest(StoredRecord):
    """The best trial so far, by dev pass rate (mean score breaking ties)."""

    trial: int
    model: str  # its adapter version, `name@N`
    base: str | None = None  # the base it trained on (runs from before `constraints.bases` lack it)
    dev_pass_rate: float
    dev_mean_score: float


class AutotuneComparison(StoredRecord):
    """A paired bootstrap comparison of two eval runs on the same held-out tasks, summed up."""

    accuracy_delta: float
    interval: list[float]  # [low, high]
    significant: bool
    fixed: int
    broken: int
    tasks: int


class AutotuneResult(StoredRecord):
    """What a finished search came to: the best version's held-out pass rate (None where the
    budget could not pay for its evaluation) against the base's (and production's)."""

    model: str
    base_model: str | None = None  # runs from before `constraints.bases` lack it
    heldout_pass_rate: float | None
    base_heldout_pass_rate: float | None = None
    against_base: AutotuneComparison | None = None
    stop_reason: str
    against_production: AutotuneComparison | None = None
    production: str | None = None


class AutotuneState(StoredRecord):
    """Where an auto run is, field by field in the order the phases set them. A field never set
    reads as its default and is not stored."""

    phase: AutotunePhase = "baseline"
    # baseline: the benchmark version (one with a dev split) and its grader
    version: int | None = None
    benchmark_version_id: str | None = None
    grader: dict[str, Any] | None = None
    # baseline: eval run ids by role (train, dev, heldout) of the base, of the other bases (by
    # base) and of the production version (`production`, its model reference)
    base_evals: dict[str, str] = {}
    other_base_evals: dict[str, dict[str, str]] = {}
    production: str | None = None
    production_evals: dict[str, str] = {}
    # baseline: the base's dev `accuracy` and `mean_score`, and the dev pass rate that stops the search
    base_dev: dict[str, float] | None = None
    dev_target: float | None = None
    # money held back for the final held-out evaluation (see `autotune.spend`)
    heldout_reserve: float = 0.0
    # baseline, for the search: the bases best dev result first, the mined datasets by kind
    # (chat, preference, prompts -> dataset id, None where mining wrote none), the methods and
    # whether the default SFT trial may train every weight
    bases: list[str] = []
    datasets: dict[str, str | None] = {}
    methods: list[str] = []
    choose_full: bool = False
    # search
    best: AutotuneBest | None = None
    # final: the best version's held-out eval run and the result
    final_eval: str | None = None
    result: AutotuneResult | None = None
    # why the search (or the run) stopped
    stop_reason: str | None = None
    # the last quota the run waited on (kept after the wait)
    waiting: str | None = None
    # ticks in a row that raised an unexpected error (removed once a tick goes through)
    tick_errors: int = 0
