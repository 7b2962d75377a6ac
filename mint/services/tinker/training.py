"""A model's training on its worker: created (a LoRA session on the resident base), and its
forward, forward_backward and optim_step requests.

These are the operations of `mint.services.tinker.runner`'s registry that make or change the
weights in memory; a forward_backward records the tokens it trained (usage). Saving and loading
weights is `mint.services.tinker.weights`. The trainer is imported only through the resident
base, so importing this module imports no torch.
"""

from __future__ import annotations

from typing import Any

from mint.services.billing.usage import record_usage
from mint.services.tinker.model_steps import ModelContext
from mint.services.tinker.releases import release_idle_models
from mint.services.tinker.resident import export_tokenizer, held, peft_name, release_model
from mint.storage.db import session_scope
from mint.trainer.types import AdamParams, Datum, LoraOptions


def create_model(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    """A new LoRA session on the resident base, held by this process, once the slots of its ended
    sessions are free."""
    release_idle_models(ctx.settings)
    resident = ctx.load_base(ctx.base_model)
    export_tokenizer(ctx.store, resident)
    release_model(ctx.model_id)  # left by an attempt that failed half way in this process
    options = LoraOptions.model_validate(payload["lora"])
    held.models[ctx.model_id] = resident.create_session(options, session_id=peft_name("m", ctx.model_id))
    return {"model_id": ctx.model_id, "type": "create_model"}


def forward_backward(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    training = ctx.training()
    data = [Datum.model_validate(item) for item in payload["data"]]
    loss_fn, config = payload["loss_fn"], payload["loss_fn_config"] or None
    if payload["forward_only"]:
        output = training.forward(data, loss_fn, config)
    else:
        output = training.forward_backward(data, loss_fn, config)
        with session_scope(ctx.settings.database) as session:
            record_usage(
                session,
                organization_id=ctx.organization_id,
                kind="trained",
                tokens=sum(datum.length for datum in data),
                base_model=ctx.base_model,
                model_ref=ctx.model_id,
                resource_type="tinker_model",
                resource_id=ctx.model_id,
            )
    return {"logprobs": output.logprobs, "metrics": output.metrics}


def optim_step(ctx: ModelContext, payload: dict[str, Any]) -> dict[str, Any]:
    metrics = ctx.training().optim_step(AdamParams.model_validate(payload["adam"]))
    return {"metrics": metrics}
