"""The `remote` grader: a reward endpoint the team hosts scores the output.

A team's own reward code (a TRL reward function, a verl `compute_score`, an OpenRLHF
`reward_func`, served by `mint reward-server` or any server speaking the protocol) never runs
inside Mint: the grader builds one item of the remote reward protocol from what was asked and
answered (`reward_item`), and the caller's `GradeContext.reward` POSTs it to the endpoint the
config names (signed, egress-checked, within `timeout_s`, retried up to `retries` times on a
5xx, a 429 or a connection error) and reads back the reward. The grader itself never reaches
the network, as the `judge` grader never reaches a model.

A reward endpoint that gives no usable reward (a timeout, an error status, a malformed,
oversized, miscounted or non-finite answer) is not the benchmark's bug: the grade is 0 and its
detail says what went wrong, so a run or a job goes on with every grade it already has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from mint.errors import InvalidRequest
from mint.evals.graders.spec import (
    Grade,
    GradeContext,
    Output,
    RewardUnavailable,
    _brief,
    _Config,
    _grader,
    output_text,
)

MAX_TIMEOUT_S = 120.0
MAX_RETRIES = 5
# An endpoint's own detail kept in the grade's detail.
MAX_DETAIL_CHARS = 500
# The row fields the protocol carries, read from a dataset row or a task's metadata (TRL, verl
# and OpenRLHF rows keep them there; see REWARD_PROTOCOL in the docs).
ROW_FIELDS = ("data_source", "extra_info", "columns")


class RemoteConfig(_Config):
    """A reward endpoint of the organization scores each output.

    `endpoint` is the endpoint's name or id (`/v1/reward_endpoints`; an eval run, job or
    benchmark naming one that does not exist is refused when it is created). Each output is
    one POST, ended after `timeout_s` in all, retried up to `retries` times on a 5xx, a 429 or
    a connection error (with backoff, within the same deadline). Passed when the reward is at
    least `pass_threshold`; rewards outside [0, 1] are clipped to it (the grade says so).
    """

    endpoint: str = Field(
        min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$", description="The reward endpoint's name or id."
    )
    timeout_s: float = Field(default=10.0, gt=0.0, le=MAX_TIMEOUT_S, description="The deadline of one output's call.")
    retries: int = Field(default=2, ge=0, le=MAX_RETRIES, description="Retries after a 5xx, 429 or connection error.")
    pass_threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Passed when the reward is at least this.")


def _completion(output: Output) -> list[dict[str, Any]]:
    """The output as the messages the model (and a harness's tools) added."""
    if output is None:
        return []
    if isinstance(output, str):
        return [{"role": "assistant", "content": output}]
    if isinstance(output, Mapping):
        return [dict(output)]
    return [dict(message) for message in output if isinstance(message, Mapping)]


def _row_field(task: Mapping[str, Any], key: str) -> Any:
    """A row's own field, else the same field of its `metadata` (where a benchmark task keeps it)."""
    if key in task:
        return task[key]
    metadata = task.get("metadata")
    return metadata.get(key) if isinstance(metadata, Mapping) else None


def reward_item(output: Output, reference: Any, context: GradeContext) -> dict[str, Any]:
    """One item of a `reward.request`: the prompt, the completion (as messages and as text), the
    reference, and the row's `data_source`, `extra_info` and `columns` where it has them."""
    data_source = _row_field(context.task, "data_source")
    extra_info = _row_field(context.task, "extra_info")
    columns = _row_field(context.task, "columns")
    extra = dict(extra_info) if isinstance(extra_info, Mapping) else {}
    if context.task_id is not None:
        extra.setdefault("task_id", context.task_id)
    return {
        "prompt": [dict(message) for message in context.prompt],
        "completion": _completion(output),
        "completion_text": output_text(output),
        "reference": reference,
        "data_source": data_source if isinstance(data_source, str) else context.source,
        "extra_info": extra,
        "columns": dict(columns) if isinstance(columns, Mapping) else {},
    }


@_grader("remote", RemoteConfig)
def _remote(output: Output, reference: Any, config: RemoteConfig, context: GradeContext) -> Grade:
    if context.reward is None:
        raise InvalidRequest(
            "the remote grader needs a way to call its reward endpoint: pass grade(..., "
            "context=GradeContext(reward=fn)); eval runs, RL jobs and episode rewards build fn "
            "from the organization's reward endpoints",
            param="context.reward",
        )
    where = f"reward endpoint {config.endpoint!r}"
    try:
        reward, detail = context.reward(
            config.endpoint, reward_item(output, reference, context), config.timeout_s, config.retries
        )
    except RewardUnavailable as exc:
        return Grade(score=0.0, passed=False, detail=f"{where} gave no reward: {exc}")
    if not math.isfinite(reward):  # the caller checks this too; a grade must never hold one
        return Grade(score=0.0, passed=False, detail=f"{where} gave no reward: {reward!r} is not a finite number")
    score = min(1.0, max(0.0, reward))
    said = f"{where}: reward {reward:g}"
    if score != reward:
        said += f" (clipped to {score:g}: grades are in [0, 1])"
    if detail:
        said += f": {_brief(detail, MAX_DETAIL_CHARS)}"
    return Grade(score=score, passed=score >= config.pass_threshold, detail=said)
