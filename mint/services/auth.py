"""Organizations and API keys, and the check that turns a key into a `Principal`.

Keys are 256-bit random secrets shown once. Only their sha256 is stored: a key has the
entropy of a token, so a slow password hash would add latency to every request and no
safety. Keys start with `tml-` because the official Tinker SDK refuses any other prefix;
the same key works for Mint's REST API, the SDK, the CLI and Tinker clients.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from mint.schemas.common import LABEL_PATTERN
from mint.services.audit import record_audit
from mint.services.principal import Principal, operator
from mint.storage.queries import PageResult, get_owned, owned_by, paginate
from mint.storage.tables import ROLES, ApiKey, Organization, as_utc, new_id, utcnow

KEY_PREFIX = "tml-"
SHOWN_PREFIX_LENGTH = 12
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


# --- organizations ------------------------------------------------------------------------


def create_organization(session: Session, *, name: str) -> Organization:
    name = name.strip()
    if not re.fullmatch(LABEL_PATTERN, name) or len(name) > 200:
        raise InvalidRequest("An organization needs a name of 1-200 printable characters.", param="name")
    if session.execute(select(Organization).where(Organization.name == name)).scalar_one_or_none():
        raise Conflict(f"An organization named {name!r} already exists; choose another name.", param="name")
    org = Organization(id=new_id("org"), name=name)
    session.add(org)
    session.flush()
    record_audit(session, operator(org.id), "organization.create", "organization", org.id, {"name": name})
    return org


def list_organizations(session: Session) -> list[Organization]:
    return list(session.execute(select(Organization).order_by(Organization.created_at)).scalars())


def find_organization(session: Session, name_or_id: str) -> Organization:
    row = (
        session.get(Organization, name_or_id)
        or session.execute(select(Organization).where(Organization.name == name_or_id)).scalar_one_or_none()
    )
    if row is None:
        raise NotFound(f"No organization named or with id {name_or_id!r}; `mint admin orgs list` shows them.")
    return row


# --- keys ---------------------------------------------------------------------------------


def create_api_key(
    session: Session,
    actor: Principal,
    *,
    name: str,
    role: str,
    expires_in_days: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key in the actor's organization; returns the row and the secret (shown once)."""
    actor.require("admin")
    if role not in ROLES:
        raise InvalidRequest(f"Unknown role {role!r}; use one of {', '.join(ROLES)}.", param="role")
    secret = generate_key()
    expires_at = utcnow() + timedelta(days=expires_in_days) if expires_in_days else None
    key = ApiKey(
        id=new_id("key"),
        organization_id=actor.organization_id,
        name=name,
        prefix=secret[:SHOWN_PREFIX_LENGTH],
        key_hash=hash_key(secret),
        role=role,
        expires_at=expires_at,
        created_by_key_id=actor.key_id,
    )
    session.add(key)
    session.flush()
    record_audit(session, actor, "api_key.create", "api_key", key.id, {"name": name, "role": role})
    return key, secret


def get_organization(session: Session, organization_id: str) -> Organization:
    """The organization of a principal (it exists: its key was just checked)."""
    return session.execute(select(Organization).where(Organization.id == organization_id)).scalar_one()


def list_api_keys(session: Session, organization_id: str, *, after: str | None, limit: int) -> PageResult[ApiKey]:
    """One page of the organization's keys, newest first (hashes and prefixes, never secrets)."""
    return paginate(session, owned_by(ApiKey, organization_id), ApiKey, after=after, limit=limit)


def all_api_keys(session: Session, organization_id: str) -> list[ApiKey]:
    """Every key of the organization, oldest first, for operators (`mint admin keys list`)."""
    query = owned_by(ApiKey, organization_id).order_by(ApiKey.created_at)
    return list(session.execute(query).scalars())


def get_api_key(session: Session, actor: Principal, key_id: str) -> ApiKey:
    return get_owned(session, ApiKey, key_id, organization_id=actor.organization_id, noun="API key")


def revoke_api_key(session: Session, actor: Principal, key_id: str) -> ApiKey:
    """Revoke a key of the actor's organization; revoking twice keeps the first time."""
    actor.require("admin")
    key = get_api_key(session, actor, key_id)
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        record_audit(session, actor, "api_key.revoke", "api_key", key.id, {"name": key.name})
    return key


def revoke_own_key(session: Session, actor: Principal) -> None:
    """Revoke the key that makes this request (any role may give up its own key: `tinker auth logout`)."""
    key = session.get(ApiKey, actor.key_id) if actor.key_id else None
    if key is None:
        raise NotFound("this request carries no API key of its own")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        record_audit(session, actor, "api_key.revoke", "api_key", key.id, {"name": key.name, "by": "itself"})


def authenticate(session: Session, secret: str | None, *, now: datetime | None = None) -> Principal:
    """The principal for a presented key, or Unauthenticated saying why it was refused.

    Also records when the key was last used (to the minute), in the caller's transaction.
    """
    if not secret:
        raise Unauthenticated(
            "No API key. Send it as `Authorization: Bearer <key>` or `X-API-Key: <key>`; "
            "`mint admin keys create` makes one."
        )
    key = session.execute(select(ApiKey).where(ApiKey.key_hash == hash_key(secret))).scalar_one_or_none()
    if key is None:
        raise Unauthenticated("Unknown API key. Check for a typo, or create a key with `mint admin keys create`.")
    now = now or utcnow()
    if key.revoked_at is not None:
        raise Unauthenticated(f"The API key {key.prefix}... was revoked; ask an admin for a new key.")
    if key.expires_at is not None and as_utc(key.expires_at) <= now:
        raise Unauthenticated(f"The API key {key.prefix}... expired at {key.expires_at:%Y-%m-%d %H:%M} UTC.")
    # One write per key per minute at most, not one per request.
    if key.last_used_at is None or now - as_utc(key.last_used_at) > LAST_USED_RESOLUTION:
        key.last_used_at = now
    return Principal(organization_id=key.organization_id, key_id=key.id, role=key.role, name=key.name)
