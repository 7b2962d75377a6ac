"""The adapter versions a fine-tuning job makes, one per stage. On the worker: the stages done
in earlier attempts (their versions exist, `done_stages`), a ready version's files to start a
stage from (`version_folder`), what a finished stage stores (`version_archive`: a PEFT adapter
and its LoRA settings, or a full-parameter stage's whole model) and its registration with its
lineage (`register_stage_version`: its parent, plan and training file). On the API: the model
a succeeded job produced and the versions its stages registered so far, for its view."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.config import Settings
from mint.errors import InvalidRequest
from mint.services.catalog import model_ref_of, model_ref_of_id
from mint.services.jobs.context import JobContext
from mint.services.models import adapters
from mint.storage.archives import pack_folder
from mint.storage.db import session_scope
from mint.storage.objects import ObjectStore
from mint.storage.tables import Adapter, AdapterVersion, Dataset, TrainingJob

if TYPE_CHECKING:
    from mint.services.jobs.context import Training


def done_stages(settings: Settings, job_id: str) -> dict[int, tuple[str, int]]:
    """The stages of this job done in earlier attempts: their versions and trained tokens."""
    with session_scope(settings.database) as session:
        rows = session.execute(select(AdapterVersion).where(AdapterVersion.training_job_id == job_id)).scalars()
        return {
            int(row.metrics.get("stage", 1)): (row.id, int(row.metrics.get("trained_tokens", 0)))
            for row in rows
            if "published_at_step" not in row.metrics  # an online RL job's versions along the way
        }


def version_folder(settings: Settings, store: ObjectStore, version_id: str, scratch: Path, *, kind: str) -> Path:
    """A ready version's files in `scratch`: a PEFT adapter, or a whole model (`kind` full)."""
    with session_scope(settings.database) as session:
        version = session.get(AdapterVersion, version_id)
        if version is None or version.status != "ready":
            raise InvalidRequest(
                f"the adapter version this job starts from ({version_id}) is no longer ready; "
                "create the job again from another version",
                param="from_adapter",
            )
        key = version.object_key
    if kind == "full":
        return adapters.extract_model(store.get_bytes(key), scratch / "model")
    return adapters.extract_adapter(store.get_bytes(key), scratch)


def version_archive(training: Training) -> tuple[bytes, dict[str, Any]]:
    """What the stage's version stores: the PEFT adapter and its LoRA settings as saved (the
    registry's defaults resolved), or a full-parameter stage's whole model (no LoRA)."""
    from mint.trainer.full import FullParameterTrainer

    with tempfile.TemporaryDirectory(prefix="mint-adapter-") as scratch:
        if isinstance(training, FullParameterTrainer):
            training.save_weights(Path(scratch))
            return pack_folder(Path(scratch)), {}
        training.save_weights_for_sampler(Path(scratch))
        saved = json.loads((Path(scratch) / "adapter_config.json").read_text())
        lora = {
            "rank": saved.get("r", 0),
            "alpha": saved.get("lora_alpha", 0),
            "targets": [*training.targets.target_modules, *training.targets.target_parameters],
        }
        return adapters.archive_adapter(Path(scratch)), lora


def register_stage_version(
    session: Session,
    store: ObjectStore,
    context: JobContext,
    job: TrainingJob,
    *,
    optimizer_steps: int,
    archive: bytes,
    lora: dict[str, Any],
) -> AdapterVersion:
    """Record the current stage's version (its archive stored already) with its lineage: the
    version it started from, the file it trained on (and its sha256), its plan and method."""
    stage = context.stage
    parent, _ = context.parent_of(stage)
    dataset = session.get(Dataset, stage.training_file) if stage.training_file is not None else None
    return adapters.register_version(
        session,
        store,
        organization_id=context.organization_id,
        name=context.adapter_name,
        base_model=context.base_model,
        archive=archive,
        lora=lora,
        kind=context.training_type,
        training_job_id=job.id,
        parent_version_id=parent,
        metrics={
            "optimizer_steps": optimizer_steps,
            "trained_tokens": context.trained_tokens,
            "method": stage.plan.method,
            # lineage: what this version was trained on and how
            "stage": stage.number,
            "training_file": stage.training_file,
            "training_file_sha256": dataset.sha256 if dataset is not None else None,
            "plan": stage.plan.model_dump(mode="json"),
        },
    )


def fine_tuned_model_of(session: Session, job: TrainingJob) -> str | None:
    """The model reference (`adapter@version`) a succeeded job produced."""
    if job.result_adapter_version_id is None:
        return None
    if session.get(AdapterVersion, job.result_adapter_version_id) is None:
        return None
    return model_ref_of_id(session, job.result_adapter_version_id)


def stage_versions_of(session: Session, job: TrainingJob) -> dict[int, tuple[str, str]]:
    """The versions a job's stages registered so far, by stage number (from 1); a job without
    stages registers its one version as stage 1."""
    rows = session.execute(
        select(AdapterVersion, Adapter)
        .join(Adapter, Adapter.id == AdapterVersion.adapter_id)
        .where(AdapterVersion.training_job_id == job.id)
    ).all()
    return {
        int(version.metrics.get("stage", 1)): (version.id, model_ref_of(adapter, version))
        for version, adapter in rows
        if "published_at_step" not in version.metrics
    }
