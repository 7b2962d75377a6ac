"""The `environment` grader: the environment that played the task's episode scores it.

A task played in an environment with its own reward (a `verifiers` environment's rubric on an
environment server, a registered Python environment's step rewards) is graded by that reward:
the eval runner sums what the environment rewarded over the episode and passes it in the
`GradeContext` (`rewarded`), with the environment's account of it (each named reward, its
errors) as the detail. An episode the environment never ended (the model ran out of steps, the
server failed) has no reward: the grade is 0 and its detail says so.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from mint.evals.graders.spec import Grade, GradeContext, Output, _Config, _grader


class EnvironmentConfig(_Config):
    """The environment's reward is the score, clipped to [0, 1]; passed when at least `pass_threshold`."""

    pass_threshold: float = Field(default=1.0, ge=0.0, le=1.0, description="Passed when the reward is at least this.")


@_grader("environment", EnvironmentConfig)
def _environment(output: Output, reference: Any, config: EnvironmentConfig, context: GradeContext) -> Grade:
    if context.environment_reward is None:
        return Grade(
            score=0.0,
            passed=False,
            detail="no reward: no environment ended this task's episode (an environment grader grades tasks whose "
            "`environment` plays them, e.g. a remote environment server's)",
        )
    reward, detail = context.environment_reward
    score = min(1.0, max(0.0, reward))
    said = detail or f"the environment's reward: {reward:g}"
    if score != reward:
        said += f" (clipped to {score:g}: grades are in [0, 1])"
    return Grade(score=score, passed=score >= config.pass_threshold, detail=said)
