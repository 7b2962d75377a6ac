"""Liveness, readiness and metrics: unauthenticated, for load balancers and Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mint import __version__
from mint.api.deps import SettingsDep
from mint.schemas.health import Liveness, Readiness
from mint.services.upkeep.health import readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness)
def healthz() -> Liveness:
    """The process is up and serving HTTP."""
    return Liveness(version=__version__)


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(settings: SettingsDep, response: Response) -> Readiness:
    """Database, broker and object store all reachable, and each base of MINT_READY_BASES loaded by
    a live serving node; 503 naming the services that are down (`failed`) and the bases still
    loading (`loading`). `serving` lists each such base, and each with live nodes, with their count."""
    result = await run_in_threadpool(readiness, settings)
    if result.status != "ok":
        response.status_code = 503
    return result


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics() -> Response:
    """Prometheus exposition format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
