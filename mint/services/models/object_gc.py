"""Garbage collection of the object store: the objects that no row references.

An object and its row cannot change in one transaction. Mint writes an object before the
transaction that records its row commits, and deletes rows before their objects
(`mint.services.upkeep.retention`), so a crash between the two leaves an object that no row
names, never a row that names a missing object. `mint admin gc` finds those orphans and,
when asked to, deletes them.

An orphan is an object
- under one of Mint's prefixes (`GC_PREFIXES`): anything else sharing the bucket is left alone;
- that no row references (`OBJECT_KEY_COLUMNS`, and the tokenizer archive of every base in
  `base_models`, which the first worker of a base writes with no row of its own);
- last written before the grace period began: an object written just before its row
  commits is younger than that, so a write in flight is never collected.

Every deletion checks again, just before it, that the key is still unreferenced and the
object still old (`delete_if_unreferenced`): a listing of a large bucket takes a while, and
an upload of identical content reuses a content-addressed key that looked orphaned.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, select, union
from sqlalchemy.orm import InstrumentedAttribute, Session

from mint.errors import NotFound
from mint.services.audit import record_audit
from mint.services.principal import Principal
from mint.storage.db import session_scope
from mint.storage.keys import EXTERNAL_FILES, GC_PREFIXES, external_file_key, tokenizer_key
from mint.storage.objects import ObjectInfo, ObjectStore
from mint.storage.tables import (
    AdapterVersion,
    BaseModelRow,
    BenchmarkVersion,
    Checkpoint,
    Dataset,
    Future,
    TinkerCheckpoint,
    TrainingSession,
    utcnow,
)

# Every column that holds an object key; tests/test_gc.py checks that no such column is missing.
OBJECT_KEY_COLUMNS: tuple[InstrumentedAttribute[Any], ...] = (
    AdapterVersion.object_key,
    BenchmarkVersion.object_key,
    Checkpoint.object_key,
    Dataset.object_key,
    Future.request_object_key,
    Future.result_object_key,
    TinkerCheckpoint.object_key,
    TrainingSession.adapter_object_key,
)
AUDITED_KEYS = 100  # keys named in the audit entry of a collection; the count covers the rest


@dataclass(frozen=True)
class Orphan:
    """An object no row references, last written `age_s` seconds before the collection began."""

    key: str
    size_bytes: int
    modified_at: datetime
    age_s: float


@dataclass
class GcReport:
    """What one collection found and, when applied, deleted."""

    grace_s: float
    applied: bool
    orphans: list[Orphan] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    # Orphans left alone at deletion time: referenced or rewritten since they were listed.
    kept: list[str] = field(default_factory=list)

    @property
    def orphan_bytes(self) -> int:
        return sum(orphan.size_bytes for orphan in self.orphans)

    @property
    def deleted_bytes(self) -> int:
        deleted = set(self.deleted)
        return sum(orphan.size_bytes for orphan in self.orphans if orphan.key in deleted)


def referenced_keys(session: Session) -> set[str]:
    """Every object key a row names: the key columns, each base's tokenizer archive, and the
    files of exported Tinker weights (whose row names their folder)."""
    query = union(*(select(column).where(column.is_not(None)) for column in OBJECT_KEY_COLUMNS))
    keys = {str(key) for key in session.execute(query).scalars()}
    keys.update(tokenizer_key(name) for name in session.execute(select(BaseModelRow.name)).scalars())
    exports = select(TinkerCheckpoint.object_key).where(TinkerCheckpoint.kind == "external")
    keys.update(
        external_file_key(folder, name) for folder in session.execute(exports).scalars() for name in EXTERNAL_FILES
    )
    return keys


def is_referenced(session: Session, key: str) -> bool:
    """Whether any row names `key`: one lookup per key column (and, for a file of exported
    weights, its folder), and the tokenizer archives."""
    named = [key]
    folder, _, name = key.rpartition("/")
    if name in EXTERNAL_FILES:
        named.append(folder)
    if any(session.execute(select(exists().where(column.in_(named)))).scalar() for column in OBJECT_KEY_COLUMNS):
        return True
    bases = session.execute(select(BaseModelRow.name)).scalars()
    return key in {tokenizer_key(name) for name in bases}


def delete_if_unreferenced(database: str, store: ObjectStore, key: str, *, written_before: datetime) -> bool:
    """Delete the object at `key` if no row references it and it was last written before
    `written_before`; True if it is gone (deleted now, or already absent).

    Called after the rows that named the key are deleted and committed. An object written
    since (a rewrite of the key, a row about to commit) is kept; `mint admin gc` collects it
    later if it stays an orphan.
    """
    with session_scope(database) as session:
        if is_referenced(session, key):
            return False
    try:
        info = store.stat(key)
    except NotFound:
        return True
    if info.modified_at is None or info.modified_at >= written_before:
        return False
    store.delete(key)
    return True


def find_orphans(database: str, store: ObjectStore, *, grace_s: float, now: datetime | None = None) -> list[Orphan]:
    """The objects under Mint's prefixes that no row references, written over `grace_s` ago.

    The references are read first, then the store is listed: an object written after the
    read is younger than the grace period (or is checked again before any deletion).
    """
    now = now or utcnow()
    cutoff = now - timedelta(seconds=grace_s)
    with session_scope(database) as session:
        referenced = referenced_keys(session)
    return [
        Orphan(info.key, info.size_bytes, info.modified_at, (now - info.modified_at).total_seconds())
        for info in _listed(store)
        if info.key not in referenced and info.modified_at is not None and info.modified_at < cutoff
    ]


def collect_garbage(
    database: str,
    store: ObjectStore,
    *,
    grace_s: float,
    apply: bool,
    actor: Principal | None = None,
    now: datetime | None = None,
) -> GcReport:
    """Find the orphans (`find_orphans`); with `apply`, delete them and audit the deletion in
    the actor's organization (`objects.gc`). Without `apply` nothing changes."""
    now = now or utcnow()
    report = GcReport(grace_s=grace_s, applied=apply, orphans=find_orphans(database, store, grace_s=grace_s, now=now))
    if not apply:
        return report
    cutoff = now - timedelta(seconds=grace_s)
    for orphan in report.orphans:
        gone = delete_if_unreferenced(database, store, orphan.key, written_before=cutoff)
        (report.deleted if gone else report.kept).append(orphan.key)
    if actor is not None:
        with session_scope(database) as session:
            record_audit(
                session,
                actor,
                "objects.gc",
                "object_store",
                "gc",
                {
                    "store": store.url,
                    "grace_s": grace_s,
                    "deleted": len(report.deleted),
                    "deleted_bytes": report.deleted_bytes,
                    "kept": len(report.kept),
                    "keys": report.deleted[:AUDITED_KEYS],
                },
            )
    return report


def _listed(store: ObjectStore) -> Iterator[ObjectInfo]:
    for prefix in GC_PREFIXES:
        yield from store.list(prefix)
