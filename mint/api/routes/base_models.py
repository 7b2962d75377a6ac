"""Base models this platform can train and serve."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from mint.api.deps import CurrentPrincipal, SessionDep
from mint.api.pagination import id_path
from mint.schemas.base_models import BaseModelPublic
from mint.services.base_models import get_base_model, list_base_models
from mint.storage.tables import BaseModelRow

router = APIRouter(prefix="/v1/base_models", tags=["base models"])


def _public(row: BaseModelRow) -> BaseModelPublic:
    return BaseModelPublic.from_row(row.name, row.enabled, row.spec)


@router.get("", response_model=list[BaseModelPublic])
def list_bases(session: SessionDep, _: CurrentPrincipal) -> list[BaseModelPublic]:
    """Every base of the registry; platform-wide, the same for every organization."""
    return [_public(row) for row in list_base_models(session)]


@router.get("/{name}", response_model=BaseModelPublic)
def get_base(
    name: Annotated[str, id_path("The base model's name.")], session: SessionDep, _: CurrentPrincipal
) -> BaseModelPublic:
    return _public(get_base_model(session, name))
