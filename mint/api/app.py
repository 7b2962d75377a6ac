"""`create_app()`: the FastAPI application of an API replica.

The API process holds nothing but connections: every request opens a database session,
and long work goes to the workers through the `Dispatch` the app is given. Importing this
module imports neither torch nor Celery and writes nothing (a test checks it): `mint api`
builds the app with Celery's dispatch (`mint.worker.dispatch.CeleryDispatch`), tests may
give their own.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from mint import __version__, tracing
from mint.api import dashboard, docs, openai, tinker
from mint.api.errors import ERROR_RESPONSES, install_error_handlers
from mint.api.gate import RequestGate
from mint.api.metrics import CAPTURES_DROPPED, CAPTURES_WRITTEN, RequestMetrics
from mint.api.request_log import RequestLog
from mint.api.routes import (
    adapters,
    api_keys,
    autotune,
    base_models,
    benchmarks,
    captures,
    datasets,
    deployments,
    episodes,
    evals,
    fine_tuning,
    health,
    organization,
    reviews,
    reward_endpoints,
    webhooks,
)
from mint.config import Settings, get_settings
from mint.services.billing.quotas import QuotaDefaults
from mint.services.dispatch import Dispatch
from mint.services.serving.captures import CaptureWriter
from mint.services.tinker.signed_urls import install_log_redaction

DESCRIPTION = """Mint: evaluate, fine-tune, re-evaluate and deploy LoRA adapters on your own base models.

Authenticate with `Authorization: Bearer <key>` or `X-API-Key: <key>`. Errors share one body:
`{"error": {"type", "message", "param"}}`."""


TINKER_OPENAI_PREFIX = "/oai/api"


def create_app(settings: Settings | None = None, *, dispatch: Dispatch | None = None) -> FastAPI:
    """The app on `settings` (the process settings by default). Routes that start work (jobs,
    eval runs, Tinker requests) send it through `dispatch`; without one they fail, and every
    other route works."""
    settings = settings or get_settings()
    logging.basicConfig(level=settings.log_level)
    tracing.install()  # every line names the request it was written for
    # Download URLs carry their credential in the query string: the access log shows it redacted.
    install_log_redaction()
    # FastAPI's /docs and /redoc load their scripts from a CDN: mint.api.docs serves Swagger UI itself.
    app = FastAPI(title="Mint", version=__version__, description=DESCRIPTION, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.dispatch = dispatch
    # Captured traffic is written on a thread of its own, in batches, within each organization's
    # capture storage quota; a captured answer is sent once its row is written.
    app.state.capture_writer = CaptureWriter(
        settings.database,
        quotas=QuotaDefaults.of(settings),
        on_written=CAPTURES_WRITTEN.inc,
        on_dropped=CAPTURES_DROPPED.inc,
    )
    install_error_handlers(app)
    # Outermost first: metrics count every answer, the gate's 401s and 413s included; the gate
    # checks the key and meters the body before the router and any route read it.
    app.add_middleware(RequestGate, settings=settings, routes=lambda: app.routes)
    app.add_middleware(RequestMetrics)
    # Outermost: the request's id is set before anything else runs, and its line written last.
    app.add_middleware(RequestLog)
    app.include_router(health.router)
    for module in (
        organization,
        api_keys,
        base_models,
        datasets,
        fine_tuning,
        adapters,
        benchmarks,
        evals,
        deployments,
        captures,
        episodes,
        autotune,
        webhooks,
        reward_endpoints,
        reviews,
        openai,
    ):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    # The Tinker-compatible routes (/api/v1/...), for the official tinker SDK and tinker-cookbook.
    app.include_router(tinker.router, responses=ERROR_RESPONSES)
    # The same OpenAI inference routes where Tinker's docs point an OpenAI client
    # (`<server>/oai/api/v1`), so code written for Tinker's endpoint runs unchanged.
    app.include_router(openai.router, prefix=TINKER_OPENAI_PREFIX, include_in_schema=False)
    app.include_router(dashboard.router)
    app.include_router(docs.router)
    return app
