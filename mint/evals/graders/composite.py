"""The `composite` grader: several graders on the same output, scored as their weighted mean.

Each part is a grader spec of its own (a composite included, up to MAX_COMPOSITE_DEPTH deep),
parsed when the composite is; a composite exposes its parts as `specs`, which is how
`GraderSpec.specs` and `kinds` see inside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from mint.errors import InvalidRequest
from mint.evals.graders.spec import Grade, GradeContext, GradePart, GraderSpec, Output, _Config, _grader, grade

# A composite's parts, and how deep composites may nest (a composite of composites of ...).
MAX_COMPOSITE_PARTS = 8
MAX_COMPOSITE_DEPTH = 3


class CompositePart(_Config):
    """One grader of a composite and its weight (weights are normalised to sum to 1)."""

    weight: float = Field(gt=0.0, le=1000.0, allow_inf_nan=False)
    grader: dict[str, Any] = Field(description="A grader spec, as at the top level (penalties excepted).")


def _composite_depth(config: Any) -> int:
    """How deeply composites nest from this config (1: no composite inside), counted before
    parsing so that a deep structure is refused without recursing into it."""
    depth, level = 1, [config]
    while depth <= MAX_COMPOSITE_DEPTH:
        inner = [
            part["grader"].get("config")
            for config in level
            if isinstance(config, Mapping) and isinstance(config.get("parts"), list)
            for part in config["parts"]
            if isinstance(part, Mapping)
            and isinstance(part.get("grader"), Mapping)
            and part["grader"].get("type") == "composite"
        ]
        if not inner:
            break
        depth, level = depth + 1, inner
    return depth


class CompositeConfig(_Config):
    """Several graders on the same output, e.g. format (regex, JSON schema) plus correctness.

    score = sum(weight_i * score_i) / sum(weight_i). `passed`: every part passed when
    `pass_threshold` is unset (the default, so full credit still means passed), else the
    weighted score reaches `pass_threshold`. Composites nest up to MAX_COMPOSITE_DEPTH deep.
    """

    parts: list[CompositePart] = Field(min_length=1, max_length=MAX_COMPOSITE_PARTS)
    pass_threshold: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Passed when the weighted score reaches this (unset: all parts)."
    )

    _specs: tuple[GraderSpec, ...] = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _not_too_deep(cls, data: Any) -> Any:
        if _composite_depth(data) > MAX_COMPOSITE_DEPTH:
            raise ValueError(f"composites nest at most {MAX_COMPOSITE_DEPTH} deep; flatten the inner parts")
        return data

    @model_validator(mode="after")
    def _parse_parts(self) -> CompositeConfig:
        specs = []
        for index, part in enumerate(self.parts):
            where = f"parts[{index}].grader"
            try:
                spec = GraderSpec.model_validate(part.grader)
            except InvalidRequest as exc:
                raise ValueError(
                    f"{where}{'.' if exc.message.startswith('grader ') else ': '}{exc.message.removeprefix('grader ')}"
                ) from None
            if spec.penalties is not None:
                raise ValueError(f"{where}: penalties belong on the composite itself, not on a part")
            specs.append(spec)
        self._specs = tuple(specs)
        return self

    @property
    def specs(self) -> tuple[GraderSpec, ...]:
        """The parts' graders, parsed."""
        return self._specs

    @property
    def weights(self) -> list[float]:
        """The parts' weights, normalised to sum to 1."""
        total = sum(part.weight for part in self.parts)
        return [part.weight / total for part in self.parts]


@_grader("composite", CompositeConfig)
def _composite(output: Output, reference: Any, config: CompositeConfig, context: GradeContext) -> Grade:
    parts = tuple(
        GradePart(type=spec.type, weight=weight, grade=grade(spec, output, reference, context=context))
        for spec, weight in zip(config.specs, config.weights, strict=True)
    )
    score = min(1.0, sum(part.weight * part.grade.score for part in parts))
    if config.pass_threshold is None:
        passed = all(part.grade.passed for part in parts)
    else:
        passed = score >= config.pass_threshold
    detail = "; ".join(f"{part.type} {part.grade.score:.2f} x {part.weight:.2f}" for part in parts)
    return Grade(score=score, passed=passed, detail=detail, parts=parts)
