"""Tinker compatibility, the worker half: running a model's requests on the process that keeps
the base resident.

A model (`mint.services.tinker.models`) lives in ONE worker process's memory
(`mint.services.tinker.resident`): that process claims it when it runs its creation and runs its
requests strictly in `seq_id` order (`run_model_requests`, with `mint.services.tinker.model_steps`),
each through the closed registry `OPERATIONS` of the Tinker primitives: training
(`mint.services.tinker.training`) and weights saved and loaded (`mint.services.tinker.weights`).
Samplers run on any worker of their base, in batches (`mint.services.tinker.sample_batches`).
Models whose session finished or expired (`mint.services.tinker.sessions.expire_idle_sessions`, a
periodic sweep) are released by a message to their process, and again by the process itself
before it takes a new LoRA session, in case that message was lost (`mint.services.tinker.releases`).

The trainer is imported only through `ResidentBase` and inside functions, so importing this
module imports no torch; only worker processes import it (`mint.worker.tinker_tasks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from mint.config import Settings
from mint.errors import MintError
from mint.services.tinker.model_steps import ModelContext, claim_model, next_step, record_or_fail
from mint.services.tinker.resident import LoadBase, WorkerIdentity
from mint.services.tinker.training import create_model, forward_backward, optim_step
from mint.services.tinker.weights import load_weights, save_weights, save_weights_external, save_weights_for_sampler
from mint.storage.objects import object_store_for

log = logging.getLogger(__name__)

# After running a model's requests, its worker watches for the next one this long: a client
# usually sends it within a fraction of a second of reading a result, and taking it from the
# database saves a trip through the broker (up to a second on the embedded broker, which polls).
LINGER_S = 0.5
LINGER_POLL_S = 0.02

# The operations, by name (a closed registry).
OPERATIONS: dict[str, Callable[[ModelContext, dict[str, Any]], dict[str, Any]]] = {
    "create_model": create_model,
    "load_weights": load_weights,
    "forward_backward": forward_backward,
    "optim_step": optim_step,
    "save_weights": save_weights,
    "save_weights_for_sampler": save_weights_for_sampler,
    "save_weights_external": save_weights_external,
}


def run_model_requests(settings: Settings, model_id: str, me: WorkerIdentity, load_base: LoadBase) -> str:
    """Run a model's waiting requests in seq_id order, claiming the model if nobody holds it;
    stops at the first missing seq_id. Returns what happened (for logs and tests)."""
    claimed = claim_model(settings, model_id, me)
    if isinstance(claimed, str):
        return claimed
    store = object_store_for(settings)
    ran, linger_until = 0, 0.0
    while True:
        step = next_step(settings, store, model_id, me.worker_id)
        if step is None:
            if time.monotonic() >= linger_until:
                break
            time.sleep(LINGER_POLL_S)
            continue
        ctx = ModelContext(
            settings,
            store,
            load_base,
            model_id,
            claimed.organization_id,
            claimed.base_model,
            claimed.tinker_session_id,
            seq_id=step.seq_id,
        )
        try:
            result = OPERATIONS[step.operation](ctx, step.payload)
            outcome: tuple[str, Any] = ("ok", result)
        except MintError as exc:
            outcome = ("user", exc.message)
        except Exception as exc:
            log.exception("request %s (%s) of model %s failed", step.future_id, step.operation, model_id)
            outcome = ("server", f"{type(exc).__name__}: {exc}")
        record_or_fail(settings, store, model_id, step, outcome)
        ran += 1
        linger_until = time.monotonic() + LINGER_S
    return f"ran {ran}"
