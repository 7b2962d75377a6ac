"""Base models: the registry files synced into the `base_models` table.

`configs/models/*.yaml` is the source; the table is what the API, jobs and foreign keys
see, so that every process agrees on which bases exist without reading the files.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import NotFound
from mint.schemas.base_models import BaseModelSpec
from mint.storage.tables import BaseModelRow


def sync_base_models(session: Session, specs: dict[str, BaseModelSpec]) -> list[BaseModelRow]:
    """Upsert every spec; bases no longer in the files are disabled, never deleted
    (jobs and adapters keep pointing at them)."""
    rows = {row.name: row for row in session.execute(select(BaseModelRow)).scalars()}
    for name, spec in specs.items():
        row = rows.get(name)
        if row is None:
            row = BaseModelRow(name=name)
            session.add(row)
            rows[name] = row
        row.architecture = spec.architecture
        row.moe = spec.moe
        row.enabled = spec.enabled
        row.spec = spec.model_dump(mode="json")
    for name, row in rows.items():
        if name not in specs:
            row.enabled = False
    session.flush()
    return sorted(rows.values(), key=lambda row: row.name)


def list_base_models(session: Session) -> list[BaseModelRow]:
    return list(session.execute(select(BaseModelRow).order_by(BaseModelRow.name)).scalars())


def get_base_model(session: Session, name: str) -> BaseModelRow:
    row = session.get(BaseModelRow, name)
    if row is None:
        known = ", ".join(r.name for r in list_base_models(session)) or "none"
        raise NotFound(f"Unknown base model {name!r}. Known bases: {known}.", param="base_model")
    return row
