"""Typed training plans (`mint.schemas.plans`): the union tells methods apart by `method`,
every number is checked (NaN and infinity included), and a plan read back from an older row,
written before plans named their method, still validates."""

from __future__ import annotations

from typing import Any

import pytest

from mint.errors import InvalidRequest
from mint.schemas.plans import PLAN_TYPES, DpoPlan, RlPlan, SftPlan, parse_plan
from mint.services.datasets import KIND_OF_METHOD
from mint.services.jobs.context import stored_plan
from mint.storage.tables import JOB_METHODS

pytestmark = pytest.mark.backend_free

COMMON: dict[str, Any] = {
    "steps": 6,
    "batch_size": 4,
    "n_epochs": 2,
    "learning_rate_multiplier": 1.0,
    "learning_rate": 4e-4,
    "checkpoint_interval": 1,
}
RL: dict[str, Any] = {
    "group_size": 4,
    "max_tokens": 32,
    "temperature": 1.0,
    "kl_beta": 0.0,
    "grader": {"type": "exact", "config": {}},
}


def test_the_union_discriminates_on_method_and_round_trips_through_json() -> None:
    plans = [
        parse_plan({"method": "sft", **COMMON}),
        parse_plan({"method": "dpo", **COMMON, "beta": 0.1}),
        parse_plan({"method": "rl", **COMMON, **RL}),
    ]
    assert [type(plan) for plan in plans] == [SftPlan, DpoPlan, RlPlan]
    for plan in plans:
        assert parse_plan(plan.model_dump(mode="json")) == plan
    assert isinstance(plans[1], DpoPlan) and plans[1].beta == 0.1
    assert isinstance(plans[2], RlPlan) and plans[2].grader.type == "exact"
    # n_epochs keeps the type the request gave it: 2 on the wire, not 2.0.
    assert plans[0].model_dump(mode="json")["n_epochs"] == 2 and isinstance(plans[0].n_epochs, int)


def test_an_rl_plan_takes_a_composite_grader_with_penalties() -> None:
    grader = {
        "type": "composite",
        "config": {"parts": [{"weight": 1, "grader": {"type": "exact"}}, {"weight": 2, "grader": {"type": "numeric"}}]},
        "penalties": {"step": 0.05, "token": 0.001, "allow_negative": True},
    }
    plan = parse_plan({"method": "rl", **COMMON, **RL, "grader": grader})
    assert isinstance(plan, RlPlan) and plan.grader.type == "composite"
    assert plan.grader.penalties is not None and plan.grader.penalties.allow_negative
    assert parse_plan(plan.model_dump(mode="json")) == plan
    with pytest.raises(InvalidRequest) as refused:
        parse_plan({"method": "rl", **COMMON, **RL, "grader": {**grader, "penalties": {"step": 2}}})
    assert refused.value.param == "grader"


def test_every_method_has_a_plan_a_dataset_kind_and_a_database_value() -> None:
    """Every method has a plan and a database value; each but online RL, which learns from a
    deployment's live episodes, trains on a kind of dataset."""
    assert set(PLAN_TYPES) == set(JOB_METHODS) == set(KIND_OF_METHOD) | {"online_rl"}


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        ({"method": "sft", **COMMON, "learning_rate": float("nan")}, "learning_rate"),
        ({"method": "sft", **COMMON, "n_epochs": float("inf")}, "n_epochs"),
        ({"method": "sft", **COMMON, "steps": 0}, "steps"),
        ({"method": "sft", **COMMON, "steps": 10**7}, "steps"),
        ({"method": "sft", **COMMON, "beta": 0.1}, "beta"),  # a DPO field on an SFT plan
        ({"method": "dpo", **COMMON}, "beta"),
        ({"method": "dpo", **COMMON, "beta": float("-inf")}, "beta"),
        ({"method": "rl", **COMMON, **RL, "temperature": 3.0}, "temperature"),
        ({"method": "rl", **COMMON, **RL, "grader": {"config": {}}}, "grader"),
        ({"method": "rl", **COMMON, **RL, "loss_fn": "reinforce"}, "loss_fn"),
        ({"method": "rl", **COMMON, **RL, "loss_fn": "cispo", "loss_fn_config": {"beta": 0.1}}, "loss_fn_config"),
        ({"method": "rl", **COMMON, **RL, "loss_fn_config": {"x": float("nan")}}, "loss_fn_config"),
        ({"method": "ppo", **COMMON}, "method"),
        (COMMON, "method"),
    ],
)
def test_a_bad_plan_is_refused_naming_its_field(plan: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_plan(plan)
    assert refused.value.param == field and field in refused.value.message


def test_a_row_written_before_plans_named_their_method_reads_it_from_the_column() -> None:
    plan = stored_plan("dpo", {**COMMON, "beta": 0.2})
    assert isinstance(plan, DpoPlan) and plan.beta == 0.2
    assert isinstance(stored_plan("dpo", {"method": "dpo", **COMMON, "beta": 0.2}), DpoPlan)
