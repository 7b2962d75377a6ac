"""The eval runs an auto run starts: a model on one split of the run's benchmark version, as an
ordinary eval run in the name of whoever started the run, and waiting for a set of them."""

from __future__ import annotations

from sqlalchemy.orm import Session

from mint.errors import InvalidRequest
from mint.schemas.evals import EvalRunCreate
from mint.services.autotune.state import FINISHED
from mint.services.autotune.tick import Tick
from mint.services.evals import runs as evals
from mint.storage.tables import EvalRun


def evaluate(tick: Tick, model: str, split: str) -> str:
    """Start an eval run of `model` on `split`; its id."""
    request = tick.request
    assert tick.state.version is not None, "the baseline settles the version first"
    body = EvalRunCreate(
        benchmark_id=tick.run.benchmark_id,
        version=tick.state.version,
        model=model,
        split=split,
        max_tokens=request.eval_max_tokens,
        seed=request.seed,
    )
    created = evals.create_eval_run(
        tick.session, tick.principal, body, send=tick.send, quotas=tick.quotas, store=tick.store
    )
    return created.id


def runs_done(session: Session, ids: dict[str, str]) -> dict[str, EvalRun] | None:
    """The eval runs by role once all finished (None while one runs); a failed one raises."""
    rows: dict[str, EvalRun] = {}
    for role, run_id in ids.items():
        row = session.get(EvalRun, run_id)
        if row is None or row.status not in FINISHED:
            return None
        rows[role] = row
    for role, row in rows.items():
        if row.status != "succeeded":
            raise InvalidRequest(f"the {role} eval run {row.id} {row.status}: {row.error}", param="benchmark_id")
    return rows


def eval_run(session: Session, run_id: str) -> EvalRun:
    """An eval run the run started (it exists)."""
    found = session.get(EvalRun, run_id)
    assert found is not None, run_id
    return found
