"""The `numeric` grader: the last number in the output against a numeric reference, within a tolerance.

Numbers are read as decimals (thousands separators and exponents included) and compared with
`Decimal` arithmetic over a wide exponent range, so a huge or tiny answer neither overflows
nor rounds into a pass; an optional partial band gives credit that falls linearly with the
distance.
"""

from __future__ import annotations

import math
import re
from decimal import MAX_EMAX, MIN_EMIN, Decimal, localcontext
from typing import Any

from pydantic import Field, model_validator

from mint.errors import InvalidRequest
from mint.evals.graders.spec import Grade, GradeContext, Output, _brief, _Config, _grader, _match, output_text

# The longest number read, so one grade stays cheap whatever the model wrote.
MAX_NUMBER_CHARS = 1_000

# Optional sign; thousands separators (1,234,567) or plain digits; decimals; exponent.
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


class NumericConfig(_Config):
    """The last number in the output must be within tolerance of the reference.

    Within tolerance: |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol): full credit, passed.
    With a partial band (`partial_band`, absolute, and/or `partial_rel_band`, a fraction of
    |reference|; the wider wins), credit falls linearly from 1 at the tolerance to 0 at the
    band's edge, and such an answer does not pass. Without one (the default), 1 or 0.
    """

    rel_tol: float = Field(default=1e-9, ge=0.0, le=1.0, allow_inf_nan=False)
    abs_tol: float = Field(default=1e-6, ge=0.0, le=1e12, allow_inf_nan=False)
    partial_band: float | None = Field(
        default=None, gt=0.0, le=1e12, allow_inf_nan=False, description="Distance at which credit reaches 0."
    )
    partial_rel_band: float | None = Field(
        default=None,
        gt=0.0,
        le=1e6,
        allow_inf_nan=False,
        description="The same, as a fraction of |reference| (0.1: credit reaches 0 at 10% off).",
    )

    @model_validator(mode="after")
    def _band_beyond_tolerance(self) -> NumericConfig:
        if self.partial_band is not None and self.partial_band <= self.abs_tol:
            raise ValueError(
                f"partial_band ({self.partial_band}) must be larger than abs_tol ({self.abs_tol}): "
                "credit falls from 1 at the tolerance to 0 at the band"
            )
        if self.partial_rel_band is not None and self.partial_rel_band <= self.rel_tol:
            raise ValueError(f"partial_rel_band ({self.partial_rel_band}) must be larger than rel_tol ({self.rel_tol})")
        return self


def _decimal(text: str) -> Decimal | None:
    if len(text) > MAX_NUMBER_CHARS:
        return None
    try:
        number = Decimal(text.replace(",", ""))
    except ArithmeticError:  # an exponent beyond what decimal can hold
        return None
    return number if number.is_finite() else None


def _reference_number(reference: Any) -> Decimal:
    number: Decimal | None = None
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        # repr, not the binary value: a reference of 0.1 means the decimal 0.1.
        number = Decimal(repr(reference)) if math.isfinite(reference) else None
    elif isinstance(reference, str) and _NUMBER.fullmatch(reference.strip()):
        number = _decimal(reference.strip())
    if number is None:
        raise InvalidRequest(
            f"the numeric grader needs a finite number (or its digits as a string) as reference, got {reference!r}; "
            "fix the task's reference",
            param="reference",
        )
    return number


@_grader("numeric", NumericConfig)
def _numeric(output: Output, reference: Any, config: NumericConfig, context: GradeContext) -> Grade:
    expected = _reference_number(reference)
    text = output_text(output)
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 -- only the last match is wanted
        pass
    if last is None:
        return _match(False, f"no number in {_brief(text)}")
    got = _decimal(last.group())
    if got is None:
        return _match(False, f"{_brief(last.group())} is too large to compare")
    # Decimal arithmetic with a wide exponent range: huge numbers compare without overflow.
    with localcontext() as decimal_context:
        decimal_context.prec, decimal_context.Emax, decimal_context.Emin = 60, MAX_EMAX, MIN_EMIN
        tolerance = max(Decimal(config.rel_tol) * max(abs(got), abs(expected)), Decimal(config.abs_tol))
        distance = abs(got - expected)
        close = distance <= tolerance
        band = max(Decimal(config.partial_band or 0), Decimal(config.partial_rel_band or 0) * abs(expected), tolerance)
        credit = 0.0
        if not close and distance < band:
            credit = float((band - distance) / (band - tolerance))
    if close:
        return _match(True, f"{last.group()} == {reference} within tolerance")
    if credit > 0:
        return Grade(
            score=min(credit, 1.0), passed=False, detail=f"{last.group()} is within the partial band of {reference}"
        )
    return _match(False, f"{last.group()} != {reference} within tolerance")
