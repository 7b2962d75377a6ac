"""Replay: re-run the recipe of an adapter version on another base, so that a lineage carries
over when a team moves to a newer base (its benchmarks, data and recipes stay; the old adapters
age out).

A version trained by a Mint job records how it was made: its stage's typed plan, its training
file (id and sha256) and its parent version. A replay walks the lineage from the version back to
its first ancestor and makes one job on the new base whose stages are those recipes in order,
each on the file it used (which must still hold the same content), with the version's LoRA rank
and alpha (the new base's own targets), or as a full-parameter job for a whole-model version.
The job's versions are then evaluated on the same benchmark version and compared with the old
lineage like any other.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest
from mint.schemas.fine_tuning import MAX_STAGES, FineTuningJobCreate, StageCreate
from mint.services import catalog
from mint.services.billing.quotas import QuotaDefaults
from mint.services.dispatch import Dispatch
from mint.services.jobs import fine_tuning, views
from mint.services.models import adapters
from mint.services.principal import Principal
from mint.storage.tables import AdapterVersion, Dataset, TrainingJob

MAX_NAME = 64


def lineage(session: Session, version: AdapterVersion) -> list[AdapterVersion]:
    """The version and its ancestors, oldest first."""
    chain = [version]
    while chain[-1].parent_version_id is not None:
        parent = session.get(AdapterVersion, chain[-1].parent_version_id)
        if parent is None:
            break
        chain.append(parent)
    return chain[::-1]


def _stage(session: Session, organization_id: str, version: AdapterVersion, ref: str) -> StageCreate:
    """The recipe a version was trained by, as a stage of a new job."""
    plan, file_id = version.metrics.get("plan"), version.metrics.get("training_file")
    if not plan or not file_id:
        raise InvalidRequest(
            f"{ref} was not trained by a Mint job (it came from a Tinker session or an upload): its recipe is not "
            "on record, so it cannot be replayed",
            param="version",
        )
    dataset = session.get(Dataset, file_id)
    if dataset is None or dataset.organization_id != organization_id:
        raise Conflict(f"{ref} was trained on {file_id}, which is gone: upload it again to replay", param="version")
    recorded = version.metrics.get("training_file_sha256")
    if recorded and dataset.sha256 != recorded:
        raise Conflict(f"{file_id} no longer holds what {ref} was trained on", param="version")
    method, _ = views.method_view(plan["method"], plan)
    section = {key: value for key, value in method[method["type"]].items() if value is not None}
    # The plan's steps say how long it trained; its n_epochs was derived from them.
    section["hyperparameters"] = {key: value for key, value in section["hyperparameters"].items() if key != "n_epochs"}
    method[method["type"]] = section
    return StageCreate.model_validate(
        {
            "method": method,
            "training_file": file_id,
            "steps": plan["steps"],
            "learning_rate": plan["learning_rate"],
            "checkpoint_interval": plan.get("checkpoint_interval"),
        }
    )


def replay_version(
    session: Session,
    principal: Principal,
    adapter_id: str,
    version_number: int,
    *,
    model: str,
    suffix: str | None,
    send: Dispatch,
    quotas: QuotaDefaults,
) -> TrainingJob:
    """A job that trains the version's lineage again on base `model`, stage by stage."""
    adapter = adapters.get_adapter(session, principal.organization_id, adapter_id)
    version = adapters.get_version(session, principal.organization_id, adapter_id, version_number)
    ref = catalog.model_ref_of(adapter, version)
    if model == version.base_model:
        raise InvalidRequest(f"{ref} is already on {model}: replay it onto another base", param="model")
    chain = lineage(session, version)
    if len(chain) > MAX_STAGES:
        raise InvalidRequest(
            f"{ref} has {len(chain)} versions in its lineage; a replay runs at most {MAX_STAGES}", param="version"
        )
    stages = [
        _stage(session, principal.organization_id, step, catalog.model_ref_of_id(session, step.id)) for step in chain
    ]
    fields: dict[str, Any] = {
        "model": model,
        "suffix": suffix or f"{adapter.name}-{model}"[:MAX_NAME],
        "metadata": {"replay_of": ref},
    }
    if version.kind == "full":  # a whole model is trained again as one: every weight, no LoRA
        fields["training_type"] = "full"
    else:
        fields["lora"] = {"rank": version.rank, "alpha": version.alpha}
    if len(stages) == 1:
        (stage,) = stages
        fields |= {"method": stage.method, **stage.model_dump(exclude={"method"}, exclude_none=True)}
    else:
        fields["stages"] = stages
    body = FineTuningJobCreate.model_validate(fields)
    return fine_tuning.create_job(session, principal, body, send=send, quotas=quotas)
