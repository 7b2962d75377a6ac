"""Adapters and their versions: upload one trained elsewhere, list, read, and download a version
in PEFT format (a tar of `adapter_config.json` and `adapter_model.safetensors`, whose sha256 is
the version's), or for a whole-model version (`kind` full) its transformers checkpoint folder."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Path, UploadFile
from fastapi.responses import StreamingResponse

from mint.api.deps import CurrentPrincipal, DispatchDep, QuotasDep, SessionDep, SettingsDep
from mint.api.downloads import TAR_MEDIA_TYPE, binary_response, stream_object
from mint.api.pagination import After, Limit, id_path, page_of
from mint.api.routes.fine_tuning import job_public
from mint.schemas.adapters import ADAPTER_NAME_PATTERN, AdapterPublic, AdapterVersionPublic, ReplayCreate
from mint.schemas.common import ID_PATTERN, MAX_VERSION, Page
from mint.schemas.fine_tuning import FineTuningJob
from mint.services import catalog
from mint.services.jobs import replay
from mint.services.models import adapters, uploads
from mint.storage.objects import object_store_for
from mint.storage.tables import Adapter, AdapterVersion

router = APIRouter(prefix="/v1/adapters", tags=["adapters"])

AdapterId = Annotated[str, id_path("The adapter's id, e.g. `adapter_...`.")]
Version = Annotated[int, Path(ge=1, le=MAX_VERSION, description="The version number, from 1.")]


def _public(adapter: Adapter, version: AdapterVersion) -> AdapterVersionPublic:
    wire = AdapterVersionPublic.model_validate(version)
    return wire.model_copy(update={"model": catalog.model_ref_of(adapter, version)})


@router.get("", response_model=Page[AdapterPublic])
def list_adapters(
    session: SessionDep, principal: CurrentPrincipal, after: After = None, limit: Limit = 20
) -> Page[AdapterPublic]:
    result = adapters.list_adapters(session, principal.organization_id, after=after, limit=limit)
    return page_of(result, AdapterPublic)


@router.post("", response_model=AdapterVersionPublic, status_code=201)
def upload_adapter(
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
    name: Annotated[
        str, Form(max_length=64, pattern=ADAPTER_NAME_PATTERN, description="The adapter's name (new or existing).")
    ],
    base_model: Annotated[
        str, Form(max_length=100, pattern=ID_PATTERN, description="The base it was trained on, e.g. `tiny-glm-moe`.")
    ],
    files: Annotated[
        list[UploadFile],
        File(description="`adapter_config.json` and `adapter_model.safetensors`, or one `.tar` holding them."),
    ],
) -> AdapterVersionPublic:
    """Bring in a LoRA adapter trained outside Mint (a PEFT folder). What can be checked without
    the base is checked now (a 400 names what is wrong); the version is then `validating` until
    a worker of its base has loaded it: `ready` to evaluate, deploy and train on, or `invalid`
    with the reason in `error`."""
    limit = settings.max_upload_bytes
    contents = {upload.filename or "": upload.file.read(limit + 1) for upload in files}
    version = uploads.upload_adapter(
        session,
        object_store_for(settings),
        dispatch,
        principal,
        name=name,
        base_model=base_model,
        files=contents,
        max_bytes=limit,
    )
    return _public(adapters.get_adapter(session, principal.organization_id, version.adapter_id), version)


@router.get("/{adapter_id}", response_model=AdapterPublic)
def get_adapter(adapter_id: AdapterId, session: SessionDep, principal: CurrentPrincipal) -> Adapter:
    return adapters.get_adapter(session, principal.organization_id, adapter_id)


@router.get("/{adapter_id}/versions", response_model=list[AdapterVersionPublic])
def list_versions(
    adapter_id: AdapterId, session: SessionDep, principal: CurrentPrincipal
) -> list[AdapterVersionPublic]:
    """Every version of the adapter, newest first; `model` is the reference to evaluate or deploy."""
    adapter = adapters.get_adapter(session, principal.organization_id, adapter_id)
    return [_public(adapter, row) for row in adapters.list_versions(session, adapter)]


@router.get("/{adapter_id}/versions/{version}", response_model=AdapterVersionPublic)
def get_version(
    adapter_id: AdapterId, version: Version, session: SessionDep, principal: CurrentPrincipal
) -> AdapterVersionPublic:
    row = adapters.get_version(session, principal.organization_id, adapter_id, version)
    return _public(adapters.get_adapter(session, principal.organization_id, adapter_id), row)


@router.get("/{adapter_id}/versions/{version}/lineage", response_model=list[AdapterVersionPublic])
def get_lineage(
    adapter_id: AdapterId, version: Version, session: SessionDep, principal: CurrentPrincipal
) -> list[AdapterVersionPublic]:
    """The version and the versions it was trained from (warm starts, earlier stages of a chained
    job), oldest first: each with its job, method, training file and metrics."""
    row = adapters.get_version(session, principal.organization_id, adapter_id, version)
    return [
        _public(adapters.get_adapter(session, principal.organization_id, ancestor.adapter_id), ancestor)
        for ancestor in replay.lineage(session, row)
    ]


@router.get(
    "/{adapter_id}/versions/{version}/download",
    response_class=StreamingResponse,
    responses=binary_response(TAR_MEDIA_TYPE, "The version's files as a tar archive."),
)
def download_version(
    adapter_id: AdapterId, version: Version, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> StreamingResponse:
    """The version's files as a tar archive, streamed: its PEFT files, which
    `peft.PeftModel.from_pretrained` loads, or for a whole-model version (`kind` full) a
    transformers checkpoint (config, safetensors weights, tokenizer) that `from_pretrained` loads
    and a `local_path` base can name. `X-Mint-SHA256` is the archive's sha256."""
    row = adapters.get_version(session, principal.organization_id, adapter_id, version)
    stream = object_store_for(settings).stream(row.object_key)
    return stream_object(stream, media_type=TAR_MEDIA_TYPE, filename=f"{row.sha256[:16]}.tar")


@router.post("/{adapter_id}/versions/{version}/replay", response_model=FineTuningJob)
def replay_version(
    adapter_id: AdapterId,
    version: Version,
    body: ReplayCreate,
    session: SessionDep,
    dispatch: DispatchDep,
    quotas: QuotasDep,
    principal: CurrentPrincipal,
) -> FineTuningJob:
    """Train this version's recipe again on another base: one job whose stages are the recipes of
    its lineage, oldest first, each on the file it used, at the version's rank and alpha. Evaluate
    its version on the same benchmark version and compare it with this one."""
    job = replay.replay_version(
        session,
        principal,
        adapter_id,
        version,
        model=body.model,
        suffix=body.suffix,
        send=dispatch,
        quotas=quotas,
    )
    return job_public(session, job)
