"""Wire types shared by every resource: the error body, OpenAI-style list pages, and what
every request body shares: finite numbers only.

Python's JSON reader (FastAPI's, and `json.loads` on uploads) accepts the non-standard
literals `NaN`, `Infinity` and `-Infinity`. No Mint number means anything as one, and
PostgreSQL refuses them in JSON columns, so they stop at the edge: `RequestModel` refuses
them in every float field (pydantic's `allow_inf_nan=False`), `FiniteJson` in free-form
JSON objects (a deployment's gate, a grader's options), and `loads_finite` in uploaded files.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

T = TypeVar("T")

# Resource ids and names as they appear in URLs: no control characters (PostgreSQL refuses
# NUL in text, and nothing legitimate needs them), no spaces, no slashes.
ID_PATTERN = r"^[A-Za-z0-9_.:@-]+$"
# What a request's `model` names: an id-like reference (a base, `adapter@version`, a deployment),
# or a `tinker://` path (named sampler weights; the resolver says what else is not served, and why).
MODEL_REF_PATTERN = r"^([A-Za-z0-9_.:@-]+|tinker://[^\x00-\x1f\x7f]+)$"
# Labels people type (key names, descriptions' titles): any printable text.
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]+$"
# Free text people write (comments, notes): anything but NUL, which PostgreSQL refuses in text.
TEXT_PATTERN = r"^[^\x00]*$"

Label = Annotated[str, Field(min_length=1, max_length=200, pattern=LABEL_PATTERN)]

# The largest seed: OpenAI's `seed` is an int64, and so is a PostgreSQL BIGINT.
MAX_SEED = 2**63 - 1
# Version and revision numbers: positive 32-bit integers in the database; a million is more
# versions than any adapter, benchmark or deployment will have.
MAX_VERSION = 1_000_000


class RequestModel(BaseModel):
    """Base of every request body: a float field refuses NaN and +-Infinity with a 422 naming it."""

    model_config = ConfigDict(allow_inf_nan=False)


def non_finite_at(value: Any, where: str = "") -> str | None:
    """The path (`a.b[2]`) of the first NaN or infinite float inside a JSON value, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where or "value"
    if isinstance(value, dict):
        items: Any = ((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for path, item in items:
        found = non_finite_at(item, path)
        if found is not None:
            return found
    return None


def _finite_json(value: Any) -> Any:
    where = non_finite_at(value)
    if where is not None:
        raise ValueError(f"{where} is NaN or infinite; write a finite number")
    return value


# A free-form JSON object of a request (options checked by a registry later): finite numbers only.
FiniteJson = Annotated[dict[str, Any], AfterValidator(_finite_json)]
# Any JSON value of a request (a grader's reference: text, a number, an object, a list): finite numbers only.
FiniteJsonValue = Annotated[Any, AfterValidator(_finite_json)]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; write a finite number or a string")


def loads_finite(text: str | bytes) -> Any:
    """`json.loads` that refuses `NaN`, `Infinity` and `-Infinity` (ValueError), as standard JSON does."""
    return json.loads(text, parse_constant=_refuse_constant)


class WireModel(BaseModel):
    """Base of every response model: built from ORM rows by attribute."""

    model_config = ConfigDict(from_attributes=True)


class ErrorDetail(BaseModel):
    type: str = Field(description="Machine-readable kind, e.g. `not_found_error`.")
    message: str = Field(description="What was wrong and how to fix it.")
    param: str | None = Field(default=None, description="The offending field or parameter, if any.")


class ErrorBody(BaseModel):
    """The one shape of every error response."""

    error: ErrorDetail


class Page(BaseModel, Generic[T]):
    """A page of a list, paged with `after=<last_id>&limit=N` as in the OpenAI API."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
