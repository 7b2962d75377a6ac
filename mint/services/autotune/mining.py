"""The training data of an auto run: datasets mined from the base's failures on train (SFT rows
with the reference answers, DPO pairs preferring the reference, RL prompts), one kind for each
method the constraints allow. What mining writes decides which methods the search tries."""

from __future__ import annotations

from mint.errors import InvalidRequest
from mint.schemas.evals import FromFailuresCreate
from mint.services.autotune.search import DATA_OF_METHOD
from mint.services.autotune.tick import Tick
from mint.services.evals import runs as evals
from mint.storage.tables import EvalRun


def mine(tick: Tick, train_run: EvalRun) -> dict[str, str | None]:
    """Datasets mined from the base's train failures, by kind (None: none could be written)."""
    wanted = {DATA_OF_METHOD[method] for method in tick.request.constraints.methods}
    mined: dict[str, str | None] = {}
    for kind in ("chat", "preference", "prompts"):
        if kind not in wanted:
            continue
        try:
            dataset, result = evals.dataset_from_failures(
                tick.session, tick.store, tick.principal, FromFailuresCreate(eval_id=train_run.id, kind=kind)
            )
        except InvalidRequest as exc:
            tick.decide(f"no {kind} data", exc.message)
            mined[kind] = None
            continue
        mined[kind] = dataset.id
        tick.decide(
            f"mine {kind} data",
            f"{dataset.row_count} rows from the base's failed {train_run.split} tasks ({dataset.id}); "
            f"{len(result.skipped)} tasks gave none",
        )
    return mined
