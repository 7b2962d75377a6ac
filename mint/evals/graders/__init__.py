"""Graders: score a model's output against a reference, for benchmarks and as RL rewards.

The registry is closed: a grader is named by `GraderSpec.type`, one of `exact`,
`normalized`, `regex`, `json_match`, `numeric`, `tool_call`, `python`, `judge`, `remote`
and `composite`, and its `config` is validated once, when the spec is built. Nothing a request sends is run as code:
a `python` grader names a function registered in Mint's code with `@register_python_grader`,
a `regex` pattern is checked for the shapes that backtrack exponentially
(`mint.chat.patterns`), and the `judge` grader only writes a prompt and reads a score: the
model call is injected by the caller (`GradeContext.judge`), so the grader itself never
reaches a model; likewise the `remote` grader builds an item and the caller's
`GradeContext.reward` POSTs it to the organization's reward endpoint.

An output is what the model produced, in any of the forms the callers hold:
- a string (a completion);
- an assistant message (`{"role": "assistant", "content": ..., "tool_calls": [...]}`);
- a trajectory: the messages the model and the environment added, in order. Text graders
  read the last assistant message; the `tool_call` grader reads every call in order.

Every grader returns a `Grade` with a score in [0, 1] and `passed`, which means full credit
(so pass rates do not move when partial credit is added). Partial credit, where the answer
has parts:
- `json_match`: the fraction of the reference's leaf fields (nested objects are walked down
  to their leaves; a list or a scalar is one leaf) that the output has with the same value;
  in mode `equal` the output's extra leaves count against it too;
- `tool_call`: per call, the right name is required (a wrong name scores 0), then
  `name_weight` plus the rest in proportion to the argument leaves that match;
- `numeric`: full credit within the tolerance, falling linearly to 0 at `partial_band`
  (off unless configured);
- `composite`: the weighted mean of its parts' scores (e.g. format plus correctness);
- `judge`: the model's `SCORE: n` over `max_score`;
- `remote`: the endpoint's reward, clipped to [0, 1].
`partial_credit: false` makes `json_match` and `tool_call` all-or-nothing.

A spec's optional `penalties` (`mint.schemas.evals.RewardPenalties`) subtract a cost per step
and per token from the score when it is used as an RL reward (`GraderSpec.reward`); grades,
and so benchmark scores and pass rates, never include them.
A reference or spec that cannot be graded is the benchmark's bug and raises `InvalidRequest`;
an output that cannot be graded (not JSON, no number) is the model's failure and scores 0.

The package is cut by grader family, one module each, so that a grader's config, its
parsing and its scoring read together: `spec` holds what they share (`GraderSpec` and the
registry, `Grade`, reading an output); `text` the `exact`, `normalized` and `regex` graders;
`numeric`, `json_match`, `tool_call`, `python`, `judge` and `composite` the grader each is
named for. Importing the package imports every family, so the registry is always complete;
callers import the names below from `mint.evals.graders`.
"""

# Each family registers its grader when imported: importing them here completes the registry.
from mint.evals.graders import (  # noqa: F401
    composite,
    environment,
    json_match,
    judge,
    numeric,
    python,
    remote,
    text,
    tool_call,
)
from mint.evals.graders.python import PythonGraderFn, python_grader_names, register_python_grader
from mint.evals.graders.spec import (
    Grade,
    GradeContext,
    GradePart,
    GraderSpec,
    JudgeFn,
    JudgeVerdict,
    Output,
    RewardFn,
    RewardUnavailable,
    grade,
    grader_types,
    output_text,
    reward_spec,
)

__all__ = [
    "Grade",
    "GradeContext",
    "GradePart",
    "GraderSpec",
    "JudgeFn",
    "JudgeVerdict",
    "Output",
    "PythonGraderFn",
    "RewardFn",
    "RewardUnavailable",
    "grade",
    "grader_types",
    "output_text",
    "python_grader_names",
    "register_python_grader",
    "reward_spec",
]
