"""Tinker checkpoints recorded as a worker records them, without a worker: for tests of what the
API does with saved checkpoints (publishing, copies, signed downloads), which need the rows and
their objects, not the training that made them."""

from __future__ import annotations

import secrets

from mint.config import Settings
from mint.schemas import tinker as wire
from mint.storage.db import session_scope
from mint.storage.keys import EXTERNAL_FILES, external_file_key, external_prefix
from mint.storage.objects import object_store_for
from mint.storage.tables import TinkerCheckpoint, TinkerSession, TrainingSession, new_id
from tests.conftest import TRAINING_BASE, Tenant


def saved_checkpoint(
    settings: Settings, tenant: Tenant, *, kind: wire.CheckpointKind = "external", name: str = "saved"
) -> str:
    """The `tinker://` path of a new checkpoint of a new rank-4 run of `tenant`: a training state
    (`kind` training, one object) or exported weights (`kind` external, the PEFT files, each
    holding its own name so that a download can be told apart)."""
    store = object_store_for(settings)
    with session_scope(settings.database) as session:
        owner = TinkerSession(id=f"tks_{secrets.token_hex(8)}", organization_id=tenant.organization_id)
        session.add(owner)
        session.flush()
        run = TrainingSession(
            id=f"{owner.id}:train:0",
            organization_id=tenant.organization_id,
            base_model=TRAINING_BASE,
            kind="training",
            status="active",
            lora={"rank": 4},
            tags={},
            tinker_session_id=owner.id,
        )
        session.add(run)
        session.flush()
        row_id = new_id("tkc")
        if kind == "external":
            key = external_prefix(row_id)
            infos = [store.put_bytes(external_file_key(key, file), file.encode()) for file in EXTERNAL_FILES]
        else:
            key = f"tinker/states/{row_id}.tar"
            infos = [store.put_bytes(key, secrets.token_bytes(64))]
        session.add(
            TinkerCheckpoint(
                id=row_id,
                organization_id=tenant.organization_id,
                model_id=run.id,
                kind=kind,
                name=name,
                object_key=key,
                sha256=infos[0].sha256,
                size_bytes=sum(info.size_bytes for info in infos),
                user_metadata={},
            )
        )
        return str(wire.TinkerPath(run.id, kind, name))
