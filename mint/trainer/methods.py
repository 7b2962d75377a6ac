"""The closed registry of training methods: a method's name -> its plan type and its runner.

A fine-tuning job's plan (`mint.schemas.plans`) names its method; the worker looks the method
up here and hands the plan, with the job's session and rows, to the method's runner:

    reports = METHODS.run(plan, RecipeInputs(training=session, tokenizer=..., rows=rows, ...))

The names are the plan union's: `register` refuses a name twice, and a plan type that is not
the union's for that name, so the API (which reads only the union) and the worker agree on
every method. A new method is one recipe module (its loop and its `run_<name>_plan`), one plan
type in `mint.schemas.plans.TrainingPlan`, and one `register` line below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from mint.errors import ConfigurationError
from mint.schemas.plans import PLAN_TYPES, DpoPlan, OnlineRlPlan, RlPlan, SftPlan, TrainingPlan
from mint.trainer.recipes.common import RecipeInputs, StepReport
from mint.trainer.recipes.dpo import run_dpo_plan
from mint.trainer.recipes.online_rl import run_online_rl_plan
from mint.trainer.recipes.rl import run_rl_plan
from mint.trainer.recipes.sft import run_sft_plan

PlanT = TypeVar("PlanT", bound=BaseModel)
Runner = Callable[[PlanT, RecipeInputs], list[StepReport]]


@dataclass(frozen=True)
class Method(Generic[PlanT]):
    """One training method: its name, the plan it runs, and the runner that trains it."""

    name: str
    plan_type: type[PlanT]
    run: Runner[PlanT]


class MethodRegistry:
    """Methods by name; a name is registered once, with the union's plan type for it."""

    def __init__(self) -> None:
        self._methods: dict[str, Method[Any]] = {}

    def register(self, name: str, plan_type: type[PlanT], run: Runner[PlanT]) -> None:
        if name in self._methods:
            raise ValueError(f"training method {name!r} is already registered; give the new method its own name")
        expected = PLAN_TYPES.get(name)
        if plan_type is not expected:
            fix = f"it runs {expected.__name__} plans" if expected else "add its plan to mint.schemas.plans first"
            raise ValueError(f"training method {name!r} cannot run {plan_type.__name__} plans: {fix}")
        self._methods[name] = Method(name=name, plan_type=plan_type, run=run)

    def names(self) -> list[str]:
        return list(self._methods)

    def get(self, name: str) -> Method[Any]:
        method = self._methods.get(name)
        if method is None:
            raise ConfigurationError(f"no training method {name!r} on this worker; it runs {', '.join(self._methods)}")
        return method

    def run(self, plan: TrainingPlan, inputs: RecipeInputs) -> list[StepReport]:
        """Train `plan` with its method's runner; the reports of the steps run."""
        method = self.get(plan.method)
        if not isinstance(plan, method.plan_type):
            raise TypeError(f"method {method.name!r} runs {method.plan_type.__name__}, not {type(plan).__name__}")
        return method.run(plan, inputs)


METHODS = MethodRegistry()
METHODS.register("sft", SftPlan, run_sft_plan)
METHODS.register("dpo", DpoPlan, run_dpo_plan)
METHODS.register("rl", RlPlan, run_rl_plan)
METHODS.register("online_rl", OnlineRlPlan, run_online_rl_plan)
