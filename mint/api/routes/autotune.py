"""Auto mode: start a run with a goal, a budget and constraints; watch its decisions, trials,
cost and best version; cancel it. Its trials are ordinary jobs and eval runs, listed with them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, DispatchDep, SessionDep
from mint.api.pagination import After, Limit, id_path, page_from
from mint.schemas.autotune import AutotuneCreate, AutotunePublic
from mint.schemas.common import Page
from mint.services.autotune import runs as autotune
from mint.storage.tables import AutotuneRun

router = APIRouter(tags=["autotune"])

RunId = Annotated[str, id_path("The auto run's id, e.g. `auto_...`.")]


def _view(session: SessionDep, run: AutotuneRun) -> AutotunePublic:
    return AutotunePublic.model_validate(autotune.run_view(session, run))


@router.post("/v1/autotune", response_model=AutotunePublic, status_code=201)
def create_autotune_run(
    body: AutotuneCreate, session: SessionDep, dispatch: DispatchDep, principal: CurrentPrincipal
) -> AutotunePublic:
    """Hand Mint a base, a benchmark, a target and a budget: it evaluates the base, mines its
    failures, chooses methods and hyperparameters (a TPE search, trials as ordinary jobs and
    eval runs chosen on the dev split), stops at the target or the budget, and names the best
    version with its held-out comparison. Every decision is logged with its reason."""
    return _view(session, autotune.create_run(session, principal, body, send=dispatch))


@router.get("/v1/autotune", response_model=Page[AutotunePublic])
def list_autotune_runs(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[AutotunePublic]:
    """This organization's auto runs, newest first."""
    result = autotune.list_runs(session, principal.organization_id, after=after, limit=limit)
    return page_from([_view(session, run) for run in result.rows], result.has_more, AutotunePublic)


@router.get("/v1/autotune/{run_id}", response_model=AutotunePublic)
def get_autotune_run(run_id: RunId, session: SessionDep, principal: CurrentPrincipal) -> AutotunePublic:
    """Status, phase, cost and time so far, the best version so far, decisions and trials."""
    return _view(session, autotune.get_run(session, principal.organization_id, run_id))


@router.post("/v1/autotune/{run_id}/cancel", response_model=AutotunePublic)
def cancel_autotune_run(run_id: RunId, session: SessionDep, principal: CurrentPrincipal) -> AutotunePublic:
    """Stop a run: its running trial's job is cancelled and the run ends `cancelled`."""
    run = autotune.cancel_run(session, principal, run_id)
    session.commit()
    return _view(session, run)
