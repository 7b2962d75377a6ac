"""The judge models of an eval run, resolved when the run is created.

A benchmark's `judge` graders name the model that judges (`config.model`): a base, an
`adapter@version`, or a deployment of the same organization. Creating a run resolves each
one here, refusing (400) a name that is not such a model of the run's organization, and pins
what it resolved to (the base, and the adapter version's content) in the run's config: the
run judges with the versions that existed when it was created, whatever is promoted or
withdrawn meanwhile. The worker (`mint.services.evals.runner`) asks them through the same
path that generates the run's own answers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, NotFound
from mint.evals.benchmark import load_canonical
from mint.evals.graders.judge import JudgeConfig
from mint.services.serving.inference import plan_for
from mint.storage.objects import ObjectStore
from mint.storage.tables import BenchmarkVersion

# Canonical JSONL writes a judge grader as {"config": {...}, "type": "judge"}: content without
# this text has none, and is not parsed at create.
_JUDGE_MARK = b'"type":"judge"'


def judge_models(store: ObjectStore, version: BenchmarkVersion) -> set[str | None]:
    """The models the version's judge graders name (None for one that names none)."""
    data = store.get_bytes(version.object_key)
    if _JUDGE_MARK not in data:
        return set()
    return {
        config.model
        for task in load_canonical(data)
        for spec in task.grader.specs()
        if isinstance(config := spec.parsed_config, JudgeConfig)
    }


def resolve_judges(
    session: Session, organization_id: str, store: ObjectStore, version: BenchmarkVersion, *, base_model: str
) -> dict[str, dict[str, Any]]:
    """Each judge model of the version -> {"base_model", "adapter"} (the `AdapterOnNode` of its
    adapter version, or None for a base); `InvalidRequest` names one that cannot judge. A
    whole-model version judges on the worker that runs the eval, so only on the run's own base."""
    refs = judge_models(store, version)
    if None in refs:
        raise InvalidRequest(
            "this benchmark version has a judge grader without config.model, so an eval run has no model to ask; "
            "name a base, adapter@version or deployment of this organization in the grader's config.model",
            param="benchmark_id",
        )
    judges: dict[str, dict[str, Any]] = {}
    for ref in sorted(ref for ref in refs if ref is not None):
        try:
            plan = plan_for(session, organization_id, ref, whole_models=True)
        except (NotFound, Conflict, InvalidRequest) as exc:
            raise InvalidRequest(
                f"the judge model {ref!r} (config.model of this benchmark's judge grader) cannot judge: {exc.message}. "
                "Name a base, adapter@version or live deployment of this organization",
                param="benchmark_id",
            ) from None
        if plan.mixture is not None:
            raise InvalidRequest(
                f"the judge model {ref!r} is a mixture deployment; a judge is one model: name one of its adapter "
                "versions (name@version) instead",
                param="benchmark_id",
            )
        if plan.adapter is not None and plan.adapter.kind == "full" and plan.base_model != base_model:
            raise InvalidRequest(
                f"the judge model {ref!r} is a whole model (training_type 'full') of base {plan.base_model!r}; it "
                f"judges on the worker that runs the eval, which holds {base_model!r}: evaluate a model of "
                f"{plan.base_model!r}, or name a base, LoRA adapter version or deployment as the judge",
                param="benchmark_id",
            )
        judges[ref] = {
            "base_model": plan.base_model,
            "adapter": plan.adapter.model_dump(mode="json") if plan.adapter is not None else None,
        }
    return judges
