"""What serves an inference request: the model reference resolved to a base and its adapters.

`model` is a base (`tiny-glm-moe`), an adapter version (`support-bot@3`, or `support-bot`
for its newest ready version) or a deployment name. A deployment is read once, at its
current revision, so one request is served wholly by one version even while the deployment
is promoted or rolled back. The plan names each adapter version by content hash and object
key, which is all a serving node needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from mint.schemas.inference import AdapterOnNode
from mint.services.catalog import deployment_of_model, model_ref_of, resolve_model_ref
from mint.services.models.adapters import require_lora
from mint.services.serving.captures import CaptureTarget, capture_target
from mint.services.serving.nodes import ADAPTER_SHARE
from mint.serving.mixture import MixtureTarget
from mint.storage.tables import Adapter, AdapterVersion, BaseModelRow, Deployment


@dataclass(frozen=True)
class ServingPlan:
    """The base, and the adapter (single) or the mixture (with its versions) that serve a request."""

    model: str
    base_model: str
    adapter: AdapterOnNode | None = None
    mixture: MixtureTarget | None = None
    deployment: str | None = None
    revision: int | None = None
    served: dict[str, Any] = field(default_factory=dict)
    capture: CaptureTarget | None = None  # a deployment's capture rate and retention, when it captures

    @property
    def affinity(self) -> str:
        """What a node's cache should already hold: the adapter's hash (or the mixture, or the base)."""
        if self.adapter is not None:
            return self.adapter.sha256
        return f"{self.deployment}#{self.revision}" if self.mixture is not None else self.base_model

    @property
    def share(self) -> int | None:
        """How many of the base's nodes share requests of this affinity (`serving_nodes.serving_order`):
        all for the base itself (no cache to keep warm), two for an adapter version, one for a
        mixture, whose router remembers tool calls so that their continuations return to the
        adapter that made them (the other nodes stand by, asked when it does not answer)."""
        if self.adapter is not None:
            return ADAPTER_SHARE
        return 1 if self.mixture is not None else None


def on_node(adapter: Adapter, version: AdapterVersion) -> AdapterOnNode:
    """The version as a node (or a worker's eval) needs it."""
    return AdapterOnNode(
        ref=model_ref_of(adapter, version),
        sha256=version.sha256,
        object_key=version.object_key,
        kind="full" if version.kind == "full" else "lora",
    )


def _on_node(session: Session, version_id: str) -> AdapterOnNode:
    version = session.get(AdapterVersion, version_id)
    adapter = session.get(Adapter, version.adapter_id) if version is not None else None
    assert version is not None and adapter is not None
    return on_node(adapter, version)


def plan_for(session: Session, organization_id: str, model: str, *, whole_models: bool = False) -> ServingPlan:
    """Resolve `model` for serving; NotFound names what exists, Conflict a withdrawn deployment.

    A whole-model version (`kind` full) is refused (InvalidRequest), since serving nodes hold
    LoRA adapters on a shared base, unless `whole_models`: a judge, asked on a worker of its base."""
    found = deployment_of_model(session, organization_id, model) if "@" not in model else None
    if found is not None:
        deployment, revision = found
        if revision.adapter_version_id is not None:
            adapter = _on_node(session, revision.adapter_version_id)
            return ServingPlan(
                model,
                deployment.base_model,
                adapter=adapter,
                deployment=deployment.name,
                revision=revision.revision,
                capture=capture_target(deployment),
            )
        mixture = MixtureTarget(
            revision_id=revision.id,
            spec=revision.routing["mixture"],
            versions={ref: _on_node(session, version_id) for ref, version_id in revision.routing["versions"].items()},
        )
        return ServingPlan(
            model,
            deployment.base_model,
            mixture=mixture,
            deployment=deployment.name,
            revision=revision.revision,
            capture=capture_target(deployment),
        )
    resolved = resolve_model_ref(session, organization_id, model)
    if resolved.adapter_version is None:
        return ServingPlan(model, resolved.base_model)
    if not whole_models:
        require_lora(resolved.adapter_version, resolved.ref, param="model")
    return ServingPlan(model, resolved.base_model, adapter=_on_node(session, resolved.adapter_version.id))


def available_models(session: Session, organization_id: str) -> list[tuple[str, datetime, str]]:
    """(id, created, owned_by) of every model the organization can send: bases, versions, deployments."""
    models: list[tuple[str, datetime, str]] = [
        (base.name, base.created_at, "mint")
        for base in session.execute(select(BaseModelRow).where(BaseModelRow.enabled.is_(True))).scalars()
    ]
    versions = session.execute(
        select(Adapter, AdapterVersion)
        .join(AdapterVersion, AdapterVersion.adapter_id == Adapter.id)
        .where(
            Adapter.organization_id == organization_id,
            AdapterVersion.status == "ready",
            AdapterVersion.kind == "lora",  # a whole model is evaluated or downloaded, not served
        )
        .order_by(Adapter.name, AdapterVersion.version)
    ).all()
    models += [(model_ref_of(adapter, version), version.created_at, organization_id) for adapter, version in versions]
    deployments = session.execute(
        select(Deployment).where(Deployment.organization_id == organization_id, Deployment.status == "active")
    ).scalars()
    models += [(deployment.name, deployment.created_at, organization_id) for deployment in deployments]
    return models


def deployment_adapters(session: Session, deployment: Deployment) -> list[AdapterOnNode]:
    """The adapter versions a deployment serves now (one, or a mixture's)."""
    plan = plan_for(session, deployment.organization_id, deployment.name)
    if plan.adapter is not None:
        return [plan.adapter]
    return list(plan.mixture.versions.values()) if plan.mixture is not None else []
