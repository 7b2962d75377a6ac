"""First-run set-up of a Mint installation: migrate, sync the base registry, and create
the first organization with its first admin key."""

from __future__ import annotations

from dataclasses import dataclass

from mint.config import Settings
from mint.schemas.base_models import load_registry
from mint.services.auth import create_api_key, create_organization, list_organizations
from mint.services.base_models import sync_base_models
from mint.services.principal import operator
from mint.storage import migrate
from mint.storage.db import session_scope


@dataclass(frozen=True)
class InitResult:
    organization_id: str
    organization_name: str
    admin_key: str | None  # None when the installation was already initialized


def prepare_database(settings: Settings) -> list[str]:
    """Migrate to head and sync `configs/models` into `base_models`; returns the base names."""
    settings.ensure_home()
    migrate.upgrade(settings.database)
    specs = load_registry(settings.model_configs_dir)
    with session_scope(settings.database) as session:
        sync_base_models(session, specs)
    return sorted(specs)


def initialize(settings: Settings, *, organization_name: str = "default") -> InitResult:
    """Idempotent: a second run migrates and syncs, and creates no second organization."""
    prepare_database(settings)
    with session_scope(settings.database) as session:
        existing = list_organizations(session)
        if existing:
            return InitResult(existing[0].id, existing[0].name, admin_key=None)
        org = create_organization(session, name=organization_name)
        _, secret = create_api_key(session, operator(org.id), name="first admin key", role="admin")
        return InitResult(org.id, org.name, admin_key=secret)
