"""Retention: `mint admin gc` collects objects no row references; beat's retention pass expires
Tinker checkpoints and prunes the checkpoints of finished jobs, rows first, then objects.

Rows are written as the services write them, on the session's real database and object store
(a folder, or S3 on moto with `--backend=services`). Object ages come from the store's own
clock, so tests that need an old object run the collection at a later `now` instead of waiting.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, select

from mint.config import Settings
from mint.services.models.object_gc import OBJECT_KEY_COLUMNS, collect_garbage, find_orphans
from mint.services.upkeep.retention import expire_tinker_checkpoints, prune_job_checkpoints
from mint.storage.db import session_scope
from mint.storage.objects import ObjectInfo, ObjectStore, open_object_store
from mint.storage.tables import (
    Adapter,
    AdapterVersion,
    Base,
    BaseModelRow,
    Checkpoint,
    Dataset,
    TinkerCheckpoint,
    TrainingJob,
    TrainingSession,
    new_id,
    utcnow,
)
from tests.conftest import TRAINING_BASE, Tenant
from tests.test_cli import mint

HOUR = timedelta(hours=1)


def fresh_store(settings: Settings) -> ObjectStore:
    """The session's store, opened anew, so that a test may break one of its methods alone."""
    return open_object_store(settings.object_store, s3_endpoint_url=settings.s3_endpoint_url)


@pytest.fixture
def probe_base(prepared: Settings) -> Iterator[str]:
    """A disabled base of this test's own, whose tokenizer archive the test may write: the real
    bases' archives are what the session's Tinker clients download, and must stay intact."""
    name = f"gc-probe-{secrets.token_hex(4)}"
    with session_scope(prepared.database) as session:
        session.add(BaseModelRow(name=name, architecture="probe", moe=False, enabled=False, spec={}))
        session.commit()
    yield name
    with session_scope(prepared.database) as session:
        session.execute(delete(BaseModelRow).where(BaseModelRow.name == name))
        session.commit()


def put(store: ObjectStore, key: str) -> str:
    store.put_bytes(key, secrets.token_bytes(64))
    return key


def adapter_version(settings: Settings, store: ObjectStore, tenant: Tenant) -> AdapterVersion:
    """An adapter version whose archive is in the store, as `adapters.register_version` records it."""
    key = put(store, f"adapters/sha256/{secrets.token_hex(32)}.tar")
    with session_scope(settings.database) as session:
        adapter = Adapter(
            id=new_id("adp"), organization_id=tenant.organization_id, name=new_id("a"), base_model=TRAINING_BASE
        )
        session.add(adapter)
        session.flush()
        version = AdapterVersion(
            id=new_id("adv"),
            adapter_id=adapter.id,
            version=1,
            object_key=key,
            sha256="0" * 64,
            size_bytes=64,
            base_model=TRAINING_BASE,
            rank=4,
            alpha=8.0,
        )
        session.add(version)
        session.flush()
        session.expunge(version)
    return version


# ---- mint admin gc ---------------------------------------------------------------------------


def test_every_column_that_holds_an_object_key_is_known_to_gc() -> None:
    """A new key column that gc did not know would have its objects collected while in use."""
    key_columns = {
        f"{table.name}.{column.name}"
        for table in Base.metadata.tables.values()
        for column in table.columns
        if column.name.endswith("object_key")
    }
    assert key_columns == {f"{column.class_.__tablename__}.{column.key}" for column in OBJECT_KEY_COLUMNS}


def test_gc_lists_old_orphans_dry_run_and_deletes_only_them_when_applied(
    prepared: Settings, tenant: Tenant, probe_base: str
) -> None:
    store = fresh_store(prepared)
    orphan = put(store, f"checkpoints/ftjob_gone{secrets.token_hex(4)}/step-0000002.tar")
    used = adapter_version(prepared, store, tenant).object_key
    tokenizer = put(store, f"tokenizers/{probe_base}.tar")  # a base's archive: no row of its own
    foreign = put(store, f"elsewhere/{secrets.token_hex(4)}")  # not under Mint's prefixes

    # Just written: within the grace period, even with --apply.
    fresh = collect_garbage(prepared.database, store, grace_s=3600, apply=True)
    assert orphan not in {o.key for o in fresh.orphans} and store.exists(orphan)

    # Two hours on: the orphan is listed, with its size and age, and a dry run deletes nothing.
    later = utcnow() + 2 * HOUR
    dry = collect_garbage(prepared.database, store, grace_s=3600, apply=False, now=later)
    listed = {o.key: o for o in dry.orphans}
    assert orphan in listed and listed[orphan].size_bytes == 64 and listed[orphan].age_s > 3600
    assert not {used, tokenizer, foreign} & set(listed)
    assert dry.deleted == [] and store.exists(orphan)

    applied = collect_garbage(prepared.database, store, grace_s=3600, apply=True, now=later)
    assert orphan in applied.deleted and not store.exists(orphan)
    assert all(store.exists(key) for key in (used, tokenizer, foreign))


def test_gc_keeps_an_orphan_that_a_row_claims_after_the_listing(
    prepared: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload of identical content may reuse an old content-addressed object while gc runs:
    the check just before each deletion sees the new row, and the object stays."""
    store = fresh_store(prepared)
    key = put(store, f"datasets/sha256/{secrets.token_hex(32)}.jsonl")
    real_list = store.list

    def list_then_a_row_claims_the_key(prefix: str = "") -> Iterator[ObjectInfo]:
        yield from real_list(prefix)
        if prefix == "datasets/":
            with session_scope(prepared.database) as session:
                session.add(
                    Dataset(
                        id=new_id("file"),
                        organization_id=tenant.organization_id,
                        filename="again.jsonl",
                        kind="chat",
                        status="ready",
                        object_key=key,
                        sha256=secrets.token_hex(32),
                        size_bytes=64,
                    )
                )

    monkeypatch.setattr(store, "list", list_then_a_row_claims_the_key)
    report = collect_garbage(prepared.database, store, grace_s=3600, apply=True, now=utcnow() + 2 * HOUR)
    assert key in {o.key for o in report.orphans} and key in report.kept and key not in report.deleted
    assert store.exists(key)


def test_admin_gc_dry_run_then_apply_audited(prepared: Settings, tenant: Tenant, client: TestClient) -> None:
    store = fresh_store(prepared)
    orphan = put(store, f"tinker/results/fut_gone{secrets.token_hex(4)}.json")
    used = adapter_version(prepared, store, tenant).object_key

    dry = json.loads(mint("admin", "gc", "--grace", "0s", "--json").stdout)
    keys = {row["key"] for row in dry["orphan_objects"]}
    assert orphan in keys and used not in keys and dry["applied"] is False and dry["deleted"] == 0
    assert dry["orphan_bytes"] >= 64 and store.exists(orphan)
    assert "delete them with --apply" in mint("admin", "gc", "--grace", "0s").stdout

    applied = json.loads(mint("admin", "gc", "--grace", "0s", "--apply", "--org", tenant.name, "--json").stdout)
    assert orphan in applied["deleted_keys"] and not store.exists(orphan) and store.exists(used)
    audit = client.get("/v1/audit_log?limit=50", headers=tenant.headers()).json()["data"]
    entry = next(e for e in audit if e["action"] == "objects.gc")
    assert entry["data"]["deleted"] == applied["deleted"] and orphan in entry["data"]["keys"]

    # The default grace period (24 h) protects everything just written; a bad one is a usage error.
    put(store, f"tinker/results/fut_new{secrets.token_hex(4)}.json")
    assert json.loads(mint("admin", "gc", "--json").stdout)["orphans"] == 0
    bad = mint("admin", "gc", "--grace", "a day", check=False)
    assert bad.returncode == 2 and "not a duration" in bad.stderr


# ---- Tinker checkpoint TTLs ------------------------------------------------------------------


def tinker_model(settings: Settings, tenant: Tenant) -> str:
    with session_scope(settings.database) as session:
        model = TrainingSession(
            id=new_id("tkm"), organization_id=tenant.organization_id, base_model=TRAINING_BASE, lora={"rank": 4}
        )
        session.add(model)
        return model.id


def tinker_checkpoint(
    settings: Settings, tenant: Tenant, model_id: str, key: str, *, expires_in: timedelta | None, kind: str = "training"
) -> str:
    """A checkpoint row as the Tinker runner upserts it after writing its object."""
    with session_scope(settings.database) as session:
        row = TinkerCheckpoint(
            id=new_id("tkc"),
            organization_id=tenant.organization_id,
            model_id=model_id,
            kind=kind,
            name=new_id("n"),
            object_key=key,
            sha256="0" * 64,
            size_bytes=64,
            expires_at=utcnow() + expires_in if expires_in is not None else None,
        )
        session.add(row)
        return row.id


def test_beat_expires_tinker_checkpoints_with_their_objects(prepared: Settings, tenant: Tenant) -> None:
    from mint.worker.app import create_celery
    from mint.worker.tasks import retention

    store = fresh_store(prepared)
    model = tinker_model(prepared, tenant)
    expired_key = put(store, f"tinker/checkpoints/{new_id('tkc')}.tar")
    # Saved with a TTL that has run out by the time the pass runs (the object is older than that).
    expired = tinker_checkpoint(prepared, tenant, model, expired_key, expires_in=timedelta(0))
    live_key = put(store, f"tinker/checkpoints/{new_id('tkc')}.tar")
    live = tinker_checkpoint(prepared, tenant, model, live_key, expires_in=HOUR)
    forever_key = put(store, f"tinker/checkpoints/{new_id('tkc')}.tar")
    forever = tinker_checkpoint(prepared, tenant, model, forever_key, expires_in=None)
    # Sampler weights are also an adapter version: the path expires, the version's object stays.
    version = adapter_version(prepared, store, tenant)
    sampler = tinker_checkpoint(prepared, tenant, model, version.object_key, expires_in=timedelta(0), kind="sampler")

    schedule = create_celery(prepared).conf.beat_schedule
    assert schedule["retention"]["task"] == retention.name == "mint.system.retention"
    report = retention()  # the task beat sends, run in this process
    assert {expired, sampler} <= set(report["expired_tinker_checkpoints"])
    assert expired_key in report["deleted_objects"] and version.object_key not in report["deleted_objects"]
    assert not store.exists(expired_key)
    assert all(store.exists(key) for key in (live_key, forever_key, version.object_key))
    with session_scope(prepared.database) as session:
        left = set(session.execute(select(TinkerCheckpoint.id).where(TinkerCheckpoint.model_id == model)).scalars())
    assert left == {live, forever}
    again = retention()  # idempotent: nothing left to do for these rows
    assert not {expired, sampler, live, forever} & set(again["expired_tinker_checkpoints"])


def test_a_crash_between_row_and_object_leaves_an_orphan_for_gc(
    prepared: Settings, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = fresh_store(prepared)
    model = tinker_model(prepared, tenant)
    key = put(store, f"tinker/checkpoints/{new_id('tkc')}.tar")
    checkpoint = tinker_checkpoint(prepared, tenant, model, key, expires_in=timedelta(0))

    def crash(_: str) -> None:
        raise RuntimeError("the process died here")

    monkeypatch.setattr(store, "delete", crash)
    with pytest.raises(RuntimeError, match="died"):
        expire_tinker_checkpoints(prepared.database, store, now=utcnow())
    monkeypatch.undo()
    with session_scope(prepared.database) as session:
        assert session.get(TinkerCheckpoint, checkpoint) is None  # no path names a missing object
    assert store.exists(key)
    orphans = find_orphans(prepared.database, store, grace_s=3600, now=utcnow() + 2 * HOUR)
    assert key in {o.key for o in orphans}


def test_deleting_a_tinker_checkpoint_removes_the_row_then_its_object(
    prepared: Settings, tenant: Tenant, client: TestClient
) -> None:
    store = fresh_store(prepared)
    model = tinker_model(prepared, tenant)
    key = put(store, f"tinker/checkpoints/{new_id('tkc')}.tar")
    checkpoint = tinker_checkpoint(prepared, tenant, model, key, expires_in=None)
    with session_scope(prepared.database) as session:
        name = session.get(TinkerCheckpoint, checkpoint).name  # type: ignore[union-attr]

    response = client.delete(f"/api/v1/training_runs/{model}/checkpoints/weights/{name}", headers=tenant.headers())
    assert response.status_code == 200, response.text
    assert response.json()["tinker_path"] == f"tinker://{model}/weights/{name}"
    with session_scope(prepared.database) as session:
        assert session.get(TinkerCheckpoint, checkpoint) is None
    assert not store.exists(key)


# ---- checkpoints of finished jobs ------------------------------------------------------------


def job_with_checkpoints(
    settings: Settings,
    store: ObjectStore,
    tenant: Tenant,
    steps: list[int],
    *,
    status: str,
    finished_in: timedelta = timedelta(0),
) -> tuple[str, dict[int, str]]:
    """A job and its checkpoints as the job runner records them (each object, then its row),
    finished `finished_in` after its last checkpoint if `status` is a final one."""
    job_id = new_id("ftjob")
    keys = {step: put(store, f"checkpoints/{job_id}/step-{step:07d}.tar") for step in steps}
    with session_scope(settings.database) as session:
        dataset = Dataset(
            id=new_id("file"),
            organization_id=tenant.organization_id,
            filename="train.jsonl",
            kind="chat",
            object_key=None,
            sha256=secrets.token_hex(32),
            size_bytes=1,
        )
        job = TrainingJob(
            id=job_id,
            organization_id=tenant.organization_id,
            base_model=TRAINING_BASE,
            method="sft",
            status=status,
            training_dataset_id=dataset.id,
            finished_at=utcnow() + finished_in if status in ("succeeded", "failed", "cancelled") else None,
        )
        session.add_all([dataset, job])
        session.flush()
        for step, key in keys.items():
            session.add(
                Checkpoint(
                    id=new_id("ftckpt"), job_id=job_id, step=step, object_key=key, sha256="0" * 64, size_bytes=64
                )
            )
    return job_id, keys


def steps_of(settings: Settings, job_id: str) -> list[int]:
    with session_scope(settings.database) as session:
        return sorted(session.execute(select(Checkpoint.step).where(Checkpoint.job_id == job_id)).scalars())


@pytest.mark.parametrize("keep", [1, 2])
def test_finished_jobs_keep_only_their_newest_checkpoints(prepared: Settings, tenant: Tenant, keep: int) -> None:
    store = fresh_store(prepared)
    week = timedelta(days=7)
    steps = [2, 4, 6]
    done, done_keys = job_with_checkpoints(prepared, store, tenant, steps, status="succeeded")
    failed, _ = job_with_checkpoints(prepared, store, tenant, steps, status="failed")
    recent, _ = job_with_checkpoints(prepared, store, tenant, steps, status="cancelled", finished_in=week + HOUR)
    running, _ = job_with_checkpoints(prepared, store, tenant, steps, status="running")

    # Two weeks on: the first two finished over a week ago, the cancelled one less than a week ago.
    later = utcnow() + 2 * week
    report = prune_job_checkpoints(prepared.database, store, keep=keep, retention_s=week.total_seconds(), now=later)
    kept_steps = steps[-keep:]
    assert steps_of(prepared, done) == steps_of(prepared, failed) == kept_steps
    assert steps_of(prepared, recent) == steps_of(prepared, running) == steps
    for step, key in done_keys.items():
        assert store.exists(key) == (step in kept_steps)
        assert (key in report.deleted_objects) == (step not in kept_steps)
    again = prune_job_checkpoints(prepared.database, store, keep=keep, retention_s=week.total_seconds(), now=later)
    assert not {*done_keys.values()} & set(again.deleted_objects)


def test_job_retention_never_deletes_an_object_an_adapter_version_references(
    prepared: Settings, tenant: Tenant
) -> None:
    store = fresh_store(prepared)
    job, keys = job_with_checkpoints(prepared, store, tenant, [1, 2], status="succeeded")
    version = adapter_version(prepared, store, tenant)
    with session_scope(prepared.database) as session:  # the version's archive is the step-1 object
        session.get(AdapterVersion, version.id).object_key = keys[1]  # type: ignore[union-attr]

    report = prune_job_checkpoints(prepared.database, store, keep=1, retention_s=0, now=utcnow() + HOUR)
    assert steps_of(prepared, job) == [2] and keys[1] not in report.deleted_objects and store.exists(keys[1])
