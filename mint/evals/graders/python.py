"""The `python` grader: a function registered in Mint's code, named by a spec.

This is how a grader that needs code joins the closed registry without a request ever
sending code: `@register_python_grader("name")` adds the function when its module is
imported, and a `{"type": "python", "config": {"name": ...}}` spec may only name one that is
registered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, field_validator

from mint.errors import ConfigurationError
from mint.evals.graders.spec import Grade, GradeContext, Output, _Config, _grader

# What a python grader's name may look like.
_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"

PythonGraderFn = Callable[[Output, Any, Mapping[str, Any]], "Grade | float"]
_PYTHON_GRADERS: dict[str, PythonGraderFn] = {}


def register_python_grader(name: str) -> Callable[[PythonGraderFn], PythonGraderFn]:
    """Register `fn(output, reference, options) -> Grade | float` under `name` for `{"type": "python"}` specs.

    A float return becomes a Grade with that score, passed when it is 1.0. Names are unique:
    registering one twice raises `ConfigurationError`, so two modules cannot shadow each other.
    """
    if not re.fullmatch(_NAME_PATTERN, name):
        raise ConfigurationError(f"python grader name {name!r} must match {_NAME_PATTERN}")

    def register(fn: PythonGraderFn) -> PythonGraderFn:
        if name in _PYTHON_GRADERS:
            raise ConfigurationError(f"python grader {name!r} is already registered; choose another name")
        _PYTHON_GRADERS[name] = fn
        return fn

    return register


def python_grader_names() -> list[str]:
    """The names a `{"type": "python"}` spec may use."""
    return sorted(_PYTHON_GRADERS)


class PythonConfig(_Config):
    """A grader function registered in code by name; `options` are passed to it."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in _PYTHON_GRADERS:
            known = ", ".join(python_grader_names()) or "none"
            raise ValueError(
                f"no python grader is registered as {name!r} (registered: {known}); python graders are "
                "registered in Mint's code with @register_python_grader, never sent with a request"
            )
        return name


@_grader("python", PythonConfig)
def _python(output: Output, reference: Any, config: PythonConfig, context: GradeContext) -> Grade:
    result = _PYTHON_GRADERS[config.name](output, reference, config.options)
    if isinstance(result, Grade):
        return result
    score = float(result)
    return Grade(score=score, passed=score == 1.0, detail=f"python grader {config.name}")
