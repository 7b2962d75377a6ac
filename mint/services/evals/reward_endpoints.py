"""Reward endpoints: an organization's reward servers, which `remote` graders name.

An endpoint is kept as a webhook is: a URL whose host must be public (unless the operator
allows private networks, `MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS`), checked when it is saved and
again before every call (`mint.services.webhooks.egress`), and a Standard Webhooks secret
(`whsec_...`) that signs every request, shown only at create and rotate. Developers and admins
change them; anyone of the organization reads them (never the secret). Every change is audited.

Graders name an endpoint by its name or its id. Creating an eval run, a job or a benchmark
whose `remote` graders name one the organization does not have is refused here
(`check_graders`), so a typo is a 400 at once rather than a zero in every grade. The calls
themselves are `mint.services.evals.remote_rewards`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.evals.benchmark import load_canonical
from mint.evals.graders import GraderSpec
from mint.evals.graders.remote import RemoteConfig
from mint.schemas.remote_environments import REMOTE_ENVIRONMENT
from mint.services.audit import record_audit
from mint.services.principal import Principal
from mint.services.webhooks import egress
from mint.services.webhooks.events import new_secret
from mint.storage.objects import ObjectStore
from mint.storage.queries import PageResult, owned_by, paginate
from mint.storage.tables import BenchmarkVersion, RewardEndpoint, new_id, utcnow

# Canonical JSONL writes a remote grader as {"config": {...}, "type": "remote"} and a remote
# environment as {"config": {...}, "name": "remote"}: content without this text has neither, and
# is not parsed at create.
_REMOTE_MARK = b'"remote"'


def _audited(session: Session, principal: Principal, action: str, endpoint: RewardEndpoint, **data: Any) -> None:
    record_audit(
        session,
        principal,
        f"reward_endpoint.{action}",
        "reward_endpoint",
        endpoint.id,
        {"name": endpoint.name, "url": endpoint.url, **data},
    )


def find_endpoint(session: Session, organization_id: str, ref: str) -> RewardEndpoint | None:
    """The organization's endpoint with id or name `ref`, or None."""
    return session.execute(
        owned_by(RewardEndpoint, organization_id).where(or_(RewardEndpoint.id == ref, RewardEndpoint.name == ref))
    ).scalar_one_or_none()


def get_endpoint(session: Session, organization_id: str, ref: str) -> RewardEndpoint:
    endpoint = find_endpoint(session, organization_id, ref)
    if endpoint is None:
        raise NotFound(f"No reward endpoint with id or name {ref!r} in this organization.", param="id")
    return endpoint


def list_endpoints(
    session: Session, organization_id: str, *, after: str | None, limit: int
) -> PageResult[RewardEndpoint]:
    return paginate(session, owned_by(RewardEndpoint, organization_id), RewardEndpoint, after=after, limit=limit)


def create_endpoint(
    session: Session,
    principal: Principal,
    *,
    name: str,
    url: str,
    description: str,
    allow_private: bool = False,
) -> RewardEndpoint:
    """Add an endpoint with a new secret (developer or admin); the name must be new in the
    organization, the host public unless `allow_private`."""
    principal.require("developer")
    egress.check_public(url, allow_private=allow_private)
    taken = session.execute(
        owned_by(RewardEndpoint, principal.organization_id).where(RewardEndpoint.name == name)
    ).scalar_one_or_none()
    if taken is not None:
        raise Conflict(
            f"a reward endpoint named {name!r} already exists ({taken.id}); change its url with "
            f"PATCH /v1/reward_endpoints/{taken.id}, or choose another name",
            param="name",
        )
    endpoint = RewardEndpoint(
        id=new_id("rwe"),
        organization_id=principal.organization_id,
        name=name,
        url=url,
        description=description,
        secret=new_secret(),
    )
    session.add(endpoint)
    session.flush()
    _audited(session, principal, "create", endpoint)
    return endpoint


def update_endpoint(
    session: Session,
    principal: Principal,
    ref: str,
    *,
    url: str | None = None,
    description: str | None = None,
    allow_private: bool = False,
) -> RewardEndpoint:
    """Change the fields given; the others stay. A new URL is checked as at create."""
    principal.require("developer")
    endpoint = get_endpoint(session, principal.organization_id, ref)
    changed: dict[str, Any] = {}
    if url is not None:
        egress.check_public(url, allow_private=allow_private)
        endpoint.url = changed["url"] = url
    if description is not None:
        endpoint.description = changed["description"] = description
    endpoint.updated_at = utcnow()
    _audited(session, principal, "update", endpoint, changed=changed)
    return endpoint


def delete_endpoint(session: Session, principal: Principal, ref: str) -> RewardEndpoint:
    """Remove an endpoint: `remote` graders naming it score 0 from now on, saying so."""
    principal.require("developer")
    endpoint = get_endpoint(session, principal.organization_id, ref)
    _audited(session, principal, "delete", endpoint)
    session.delete(endpoint)
    session.flush()
    return endpoint


def rotate_secret(session: Session, principal: Principal, ref: str) -> RewardEndpoint:
    """Give the endpoint a new secret at once: requests from now on are signed with it only."""
    principal.require("developer")
    endpoint = get_endpoint(session, principal.organization_id, ref)
    endpoint.secret = new_secret()
    endpoint.updated_at = utcnow()
    _audited(session, principal, "rotate_secret", endpoint)
    return endpoint


def endpoint_refs(specs: Iterable[GraderSpec]) -> set[str]:
    """The endpoints the `remote` graders of `specs` name, a composite's parts included."""
    return {
        config.endpoint
        for spec in specs
        for part in spec.specs()
        if isinstance(config := part.parsed_config, RemoteConfig)
    }


def check_refs(session: Session, organization_id: str, refs: set[str], *, param: str, named_by: str) -> None:
    """Refuse (400, naming `param`) endpoint names or ids the organization lacks; `named_by` says
    what named them (a remote grader, a remote environment)."""
    if not refs:
        return
    known = session.execute(
        select(RewardEndpoint.id, RewardEndpoint.name).where(
            RewardEndpoint.organization_id == organization_id,
            or_(RewardEndpoint.id.in_(refs), RewardEndpoint.name.in_(refs)),
        )
    ).all()
    found = {value for row in known for value in row}
    missing = sorted(refs - found)
    if missing:
        raise InvalidRequest(
            f"{named_by} names endpoint {missing[0]!r}, which this organization does not have; "
            "create it with POST /v1/reward_endpoints (or `mint reward-endpoints create`), or fix config.endpoint",
            param=param,
        )


def check_graders(session: Session, organization_id: str, specs: Iterable[GraderSpec], *, param: str) -> None:
    """Refuse (400, naming `param`) graders that name a reward endpoint the organization lacks."""
    check_refs(session, organization_id, endpoint_refs(specs), param=param, named_by="the remote grader")


def check_environment(session: Session, organization_id: str, spec: Mapping[str, Any] | None, *, param: str) -> None:
    """Refuse (400, naming `param`) a `remote` environment spec whose server the organization lacks."""
    if spec is None or spec.get("name") != REMOTE_ENVIRONMENT:
        return
    endpoint = (spec.get("config") or {}).get("endpoint")
    if isinstance(endpoint, str):
        check_refs(session, organization_id, {endpoint}, param=param, named_by="the remote environment")


def check_version(session: Session, organization_id: str, store: ObjectStore, version: BenchmarkVersion) -> None:
    """Refuse (400) an eval run of a benchmark version whose `remote` graders name a reward
    endpoint the organization lacks (as `mint.services.evals.judges` refuses a missing judge)."""
    data = store.get_bytes(version.object_key)
    if _REMOTE_MARK in data:
        tasks = load_canonical(data)
        check_graders(session, organization_id, (task.grader for task in tasks), param="benchmark_id")
        servers = {
            str(task.named_environment.config.get("endpoint"))
            for task in tasks
            if task.named_environment is not None and task.named_environment.name == REMOTE_ENVIRONMENT
        }
        check_refs(session, organization_id, servers, param="benchmark_id", named_by="a task's remote environment")
