"""A trial's fine-tuning job: the ordinary job request the search's parameters make (method,
learning-rate multiplier, LoRA rank or every weight, steps, base), and its estimate, checked as
a create would check it. SFT then RL is one job of two stages, half the steps each."""

from __future__ import annotations

import re
from typing import Any

from mint.schemas.autotune import AutotuneCreate
from mint.schemas.fine_tuning import FineTuningJobCreate
from mint.services.autotune.search import DATA_OF_METHOD
from mint.services.autotune.tick import Tick
from mint.services.jobs import checks


def training_type(request: AutotuneCreate, params: dict[str, Any]) -> str:
    """A trial's training type: its own where trials choose; else full only where the constraints
    allow nothing else (a run that dropped full-parameter training, or whose methods are not SFT,
    trains LoRA whatever order the constraints list the types in)."""
    chosen = params.get("training_type")
    if chosen is not None:
        return str(chosen)
    return "full" if request.constraints.training_types == ["full"] else "lora"


def priced(tick: Tick, params: dict[str, Any], number: int) -> tuple[FineTuningJobCreate, Any]:
    """The trial's job request and its estimate (checked as a create would check it)."""
    body = job_body(tick, params, number)
    return body, checks.check_job(tick.session, tick.run.organization_id, body).estimate


def job_body(tick: Tick, params: dict[str, Any], number: int) -> FineTuningJobCreate:
    """Trial `number`'s job request."""
    run, request = tick.run, tick.request
    datasets = tick.state.datasets
    method = params["method"]
    multiplier = params["learning_rate_multiplier"]
    rl: dict[str, Any] = {"type": "reinforcement", "reinforcement": {"grader": tick.state.grader or {"type": "exact"}}}
    base = params.get("base", run.base_model)
    suffix = request.suffix or f"auto-{run.id.removeprefix('auto_')[:12].lower()}"
    if base != run.base_model:  # an adapter belongs to one base: each base's trials get their own
        suffix = f"{suffix}-{re.sub(r'[^a-z0-9-]', '-', base.lower())}"[:48]
    common: dict[str, Any] = {
        "model": base,
        "seed": (request.seed + number) % (2**31 - 1),
        "suffix": suffix,
        "metadata": {"autotune_run": run.id, "trial": str(number)},
    }
    if training_type(request, params) == "full":
        common["training_type"] = "full"
    else:
        common["lora"] = {"rank": params["rank"], "alpha": 2 * params["rank"]}
    if method == "sft_rl":
        half = max(1, params["steps"] // 2)
        hyper = {"hyperparameters": {"learning_rate_multiplier": multiplier}}
        stages = [
            {"method": {"type": "supervised", "supervised": hyper}, "training_file": datasets["chat"], "steps": half},
            {
                "method": {**rl, "reinforcement": {**rl["reinforcement"], **hyper}},
                "training_file": datasets["prompts"],
                "steps": half,
            },
        ]
        return FineTuningJobCreate.model_validate({**common, "stages": stages})
    kinds = {"sft": "supervised", "dpo": "dpo", "rl": "reinforcement"}
    section: dict[str, Any] = {"hyperparameters": {"learning_rate_multiplier": multiplier}}
    if method == "rl":
        section["grader"] = rl["reinforcement"]["grader"]
    return FineTuningJobCreate.model_validate(
        {
            **common,
            "training_file": datasets[DATA_OF_METHOD[method]],
            "steps": params["steps"],
            "method": {"type": kinds[method], kinds[method]: section},
        }
    )
