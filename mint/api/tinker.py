"""Tinker-compatible routes at `/api/v1/...`: the official `tinker` SDK and tinker-cookbook run against Mint.

Point the SDK at Mint with `ServiceClient(base_url=<Mint URL>, api_key=<a Mint key>)` (or
`TINKER_BASE_URL` / `TINKER_API_KEY`); Mint's keys start with `tml-` and travel in the
`X-API-Key` header, as the SDK sends them. Long operations answer with a future at once;
`retrieve_future` holds the request until the result is ready (about 25 s at most, then
"try again"). The forward/backward request and the results of forward, forward_backward
and sample are Protocol Buffers, so those two routes stay out of the OpenAPI document.

Routes parse and map; `mint.services.tinker.sessions`, `.models`, `.sampling` and `.futures` do the
work (see the sessions module's docstring for how models, samplers and futures map onto Mint), and
`mint.services.tinker.checkpoints` answers the training runs, checkpoints and tokenizers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from mint.api.deps import CurrentPrincipal, DispatchDep, QuotasDep, SessionDep, SettingsDep
from mint.api.downloads import TAR_MEDIA_TYPE, binary_response, stream_object
from mint.api.errors import error_response
from mint.api.pagination import id_path
from mint.errors import InvalidRequest
from mint.schemas import tinker as wire
from mint.schemas import tinker_proto as proto
from mint.services import auth
from mint.services.tinker import checkpoints as tinker_checkpoints
from mint.services.tinker import futures as tinker_futures
from mint.services.tinker import models as tinker_models
from mint.services.tinker import projects, sampling, signed_urls
from mint.services.tinker import sessions as tinker_sessions
from mint.services.tinker import traces as tinker_traces
from mint.storage.objects import object_store_for

router = APIRouter(prefix="/api/v1", tags=["tinker"])

SessionId = Annotated[str, id_path("A Tinker session id (`create_session`), e.g. `tks_...`.")]
ModelId = Annotated[str, id_path("A training run's (model's) id, `<session>:train:<n>`.")]
SamplerId = Annotated[str, id_path("A sampler's id, `<session>:sample:<n>`.")]
BaseName = Annotated[str, id_path("A base model's name, e.g. `tiny-glm-moe`.")]
Offset = Annotated[int, Query(ge=0, le=10**9, description="Items to skip.")]

# retrieve_future reads a waiting future's row after 10 ms, then less and less often, down to
# this: a result is seen within this long of being written.
POLL_MAX_DELAY_S = 0.1


# ---- client start-up and sessions -------------------------------------------------------------


@router.get("/healthz", response_model=wire.HealthResponse)
def healthz() -> wire.HealthResponse:
    """Liveness of the API (no key needed)."""
    return wire.HealthResponse()


@router.post("/client/config", response_model=wire.ClientConfigResponse)
def client_config(
    body: wire.ClientConfigRequest, settings: SettingsDep, _: CurrentPrincipal
) -> wire.ClientConfigResponse:
    """Feature flags for the SDK: API-key auth, custom losses run client-side, and how to split a
    forward_backward batch so that each request stays within this server's limits."""
    return wire.ClientConfigResponse(**proto.BatchLimits.from_settings(settings).chunking())


@router.post("/client/dynamic_config", response_model=wire.ClientDynamicConfigResponse)
def client_dynamic_config(body: wire.ClientConfigRequest, _: CurrentPrincipal) -> wire.ClientDynamicConfigResponse:
    return wire.ClientDynamicConfigResponse()


@router.get("/get_server_capabilities", response_model=wire.GetServerCapabilitiesResponse)
def get_server_capabilities(session: SessionDep, _: CurrentPrincipal) -> wire.GetServerCapabilitiesResponse:
    """The enabled base models: each can be trained with LoRA and sampled."""
    return tinker_sessions.server_capabilities(session)


@router.post("/telemetry", response_model=wire.TelemetryResponse)
def telemetry(body: wire.TelemetryRequest, _: CurrentPrincipal) -> wire.TelemetryResponse:
    """The SDK's own diagnostics: accepted and dropped."""
    return wire.TelemetryResponse()


@router.post("/create_session", response_model=wire.CreateSessionResponse)
def create_session(
    body: wire.CreateSessionRequest, session: SessionDep, quotas: QuotasDep, principal: CurrentPrincipal
) -> wire.CreateSessionResponse:
    """Start a Tinker session (one per `ServiceClient`); an organization at its quota of live
    sessions gets a 429."""
    row = tinker_sessions.create_session(session, principal.organization_id, body, quotas=quotas)
    return wire.CreateSessionResponse(session_id=row.id)


@router.post("/session_heartbeat", response_model=wire.SessionHeartbeatResponse)
def session_heartbeat(body: wire.SessionHeartbeatRequest, session: SessionDep, principal: CurrentPrincipal) -> Any:
    """Keep a session alive; 410 once it is finished (the SDK then stops)."""
    if not tinker_sessions.heartbeat(session, principal.organization_id, body.session_id):
        return error_response(410, "gone_error", f"session {body.session_id} is finished", "session_id")
    return wire.SessionHeartbeatResponse()


@router.post("/sessions/{session_id}/finish", response_model=wire.FinishSessionResponse)
def finish_session(
    session_id: SessionId,
    body: wire.FinishSessionRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.FinishSessionResponse:
    """Finish a session: its models are released from their workers, its samplers closed."""
    tinker_sessions.finish_session(session, principal.organization_id, session_id, body, dispatch)
    return wire.FinishSessionResponse(session_id=session_id)


@router.get("/sessions", response_model=wire.ListSessionsResponse)
def list_sessions(
    session: SessionDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Offset = 0,
) -> wire.ListSessionsResponse:
    return wire.ListSessionsResponse(
        sessions=tinker_sessions.list_sessions(session, principal.organization_id, limit=limit, offset=offset)
    )


@router.get("/sessions/{session_id}", response_model=wire.GetSessionResponse)
def get_session(session_id: SessionId, session: SessionDep, principal: CurrentPrincipal) -> wire.GetSessionResponse:
    return tinker_sessions.session_view(session, principal.organization_id, session_id)


@router.get("/sessions/{session_id}/trace_export", response_model=wire.TraceExportResponse)
def export_session_trace(
    session_id: SessionId, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> wire.TraceExportResponse:
    """The session's requests on a timeline (Chrome trace JSON, for https://ui.perfetto.dev), as a
    download URL that needs no key (`tinker session export-trace`), valid while this key is."""
    return tinker_traces.export_session_trace(
        session,
        settings,
        object_store_for(settings),
        principal.organization_id,
        session_id,
        signed_urls.Grant.of(principal),
    )


@router.put("/sessions/{session_id}/project", response_model=wire.AssignProjectResponse)
def assign_session_project(
    session_id: SessionId, body: wire.AssignProjectRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.AssignProjectResponse:
    """File a session, with its runs and samplers, under a project (a label inside the organization)."""
    row = projects.assign_project(session, principal.organization_id, session_id, body.project_id)
    return wire.AssignProjectResponse(session_id=row.id, project_id=body.project_id)


@router.post("/sessions/search", response_model=wire.SessionSearchResponse)
def search_sessions(
    body: wire.SessionSearchRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.SessionSearchResponse:
    """The organization's sessions that match, newest first, a page at a time."""
    return projects.search_sessions(session, principal.organization_id, body)


@router.post("/copy_weights", response_model=wire.CopyWeightsResponse)
def copy_weights(
    body: wire.CopyWeightsRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.CopyWeightsResponse:
    """Copy a checkpoint (yours, or published) into a new run of this organization that cannot be
    trained on; the copy shares the source's stored objects."""
    path = projects.copy_weights(session, principal.organization_id, body)
    return wire.CopyWeightsResponse(tinker_path=str(path))


# ---- training models --------------------------------------------------------------------------


def _future(future: Any) -> wire.UntypedAPIFuture:
    return wire.UntypedAPIFuture(request_id=future.id, model_id=future.model_id)


@router.post("/create_model", response_model=wire.UntypedAPIFuture)
def create_model(
    body: wire.CreateModelRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """A LoRA training model on a base; created by the first worker of the base to take it."""
    return _future(tinker_models.create_model(session, settings, principal.organization_id, body, dispatch))


@router.post("/get_info", response_model=wire.GetInfoResponse)
def get_info(
    body: wire.GetInfoRequest, session: SessionDep, settings: SettingsDep, principal: CurrentPrincipal
) -> wire.GetInfoResponse:
    """The model's base, LoRA rank and tokenizer (a local folder the client loads offline)."""
    return tinker_checkpoints.get_info(session, settings, principal.organization_id, body.model_id)


async def _protobuf_body(request: Request) -> bytes:
    # Its size limit (settings.tinker_max_body_bytes) is enforced by the request gate while it streams.
    if request.headers.get("content-encoding", "identity") not in ("identity", ""):
        raise InvalidRequest("send the forward_backward body uncompressed (this server turns compression off)")
    if not request.headers.get("content-type", "").startswith(proto.PROTOBUF_MEDIA_TYPE):
        raise InvalidRequest(
            f"forward_backward takes a {proto.PROTOBUF_MEDIA_TYPE} body (tinker_public.ForwardBackwardRequest)"
        )
    return await request.body()


@router.post("/forward_backward", response_model=wire.UntypedAPIFuture, include_in_schema=False)
def forward_backward(
    body: Annotated[bytes, Depends(_protobuf_body)],
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Forward (and backward, unless `forward_only`) over a batch; the body is protobuf, bounded
    by the `tinker_max_*` settings before it is decoded (413 past them)."""
    request = proto.decode_forward_backward_request(body, proto.BatchLimits.from_settings(settings))
    future = tinker_models.submit_forward_backward(session, settings, principal.organization_id, request, dispatch)
    return _future(future)


@router.post("/optim_step", response_model=wire.UntypedAPIFuture)
def optim_step(
    body: wire.OptimStepRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    return _future(tinker_models.submit_optim_step(session, settings, principal.organization_id, body, dispatch))


@router.post("/save_weights", response_model=wire.UntypedAPIFuture)
def save_weights(
    body: wire.SaveWeightsRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Save the training state (weights, Adam moments, step) as `tinker://<model>/weights/<name>`."""
    return _future(tinker_models.submit_save_weights(session, settings, principal.organization_id, body, dispatch))


@router.post("/save_weights_for_sampler", response_model=wire.UntypedAPIFuture)
def save_weights_for_sampler(
    body: wire.SaveWeightsForSamplerRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Named: an adapter version and `tinker://<model>/sampler_weights/<name>`; unnamed: a new sampler."""
    future = tinker_models.submit_save_weights_for_sampler(session, settings, principal.organization_id, body, dispatch)
    return _future(future)


@router.post("/save_weights_external", response_model=wire.UntypedAPIFuture)
def save_weights_external(
    body: wire.SaveWeightsExternalRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Export the LoRA weights as PEFT files, `tinker://<model>/external_weights/<name>`, to download
    through `external_weights_urls` (what `tinker checkpoint download` does)."""
    future = tinker_models.submit_save_weights_external(session, settings, principal.organization_id, body, dispatch)
    return _future(future)


@router.post("/load_weights", response_model=wire.UntypedAPIFuture)
def load_weights(
    body: wire.LoadWeightsRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Load a checkpoint into a model, or create a model from it."""
    return _future(tinker_models.submit_load_weights(session, settings, principal.organization_id, body, dispatch))


# ---- samplers ---------------------------------------------------------------------------------


@router.post("/create_sampling_session", response_model=wire.CreateSamplingSessionResponse)
def create_sampling_session(
    body: wire.CreateSamplingSessionRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.CreateSamplingSessionResponse:
    """A sampler of a base, or of sampler weights (`tinker://<model>/sampler_weights/<name>`)."""
    row = sampling.create_sampling_session(session, principal.organization_id, body)
    return wire.CreateSamplingSessionResponse(sampling_session_id=row.id)


@router.get("/samplers/{sampler_id}", response_model=wire.GetSamplerResponse)
def get_sampler(sampler_id: SamplerId, session: SessionDep, principal: CurrentPrincipal) -> wire.GetSamplerResponse:
    return sampling.get_sampler(session, principal.organization_id, sampler_id)


@router.post("/asample", response_model=wire.UntypedAPIFuture)
def asample(
    body: wire.SampleRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> wire.UntypedAPIFuture:
    """Sample continuations (with their logprobs) on a worker of the sampler's base."""
    future, sequence_ids = sampling.submit_sample(session, settings, principal.organization_id, body, dispatch)
    return wire.UntypedAPIFuture(request_id=future.id, model_id=future.model_id, sample_sequence_ids=sequence_ids)


# ---- futures ----------------------------------------------------------------------------------


def _answer(state: tinker_futures.FutureState, paused_because: str | None) -> Response:
    if state.status == "succeeded":
        if state.operation in tinker_futures.PROTOBUF_OPERATIONS:
            return Response(tinker_futures.encode_result(state), media_type=proto.PROTOBUF_MEDIA_TYPE)
        return JSONResponse(state.result)
    if state.done:
        return JSONResponse({"error": state.error, "category": state.category})
    body = {"type": "try_again", "request_id": state.request_id, "queue_state": "active"}
    if paused_because:
        body |= {"queue_state": "paused_capacity", "queue_state_reason": paused_because}
    return JSONResponse(body)


@router.post("/retrieve_future", include_in_schema=False)
async def retrieve_future(
    body: wire.FutureRetrieveRequest,
    session: SessionDep,
    settings: SettingsDep,
    dispatch: DispatchDep,
    principal: CurrentPrincipal,
) -> Response:
    """A future's result (protobuf for forward, forward_backward and sample), its error, or, after
    holding the request up to 25 s, `try_again`."""
    # Authenticated: end the request's transaction so its connection is not held while polling.
    await run_in_threadpool(session.commit)
    deadline = time.monotonic() + tinker_futures.LONG_POLL_S
    next_inspection, delay = 0.0, 0.01
    paused_because: str | None = None  # what the last look at the future's worker found
    while True:
        now = time.monotonic()
        inspect = now >= next_inspection
        if inspect:
            next_inspection = now + tinker_futures.INSPECT_EVERY_S
        state = await run_in_threadpool(
            tinker_futures.poll_future, settings, principal.organization_id, body.request_id, dispatch, inspect=inspect
        )
        if inspect:
            paused_because = state.queue_state_reason
        if state.done or time.monotonic() + delay >= deadline:
            return _answer(state, paused_because)
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, POLL_MAX_DELAY_S)


@router.post("/cancel_future", response_model=wire.CancelFutureResponse)
def cancel_future(
    body: wire.CancelFutureRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.CancelFutureResponse:
    """Cancel a request that has not started."""
    status = tinker_futures.cancel_future(session, principal.organization_id, body.request_id)
    return wire.CancelFutureResponse(request_id=body.request_id, status=status)


# ---- training runs and checkpoints ------------------------------------------------------------


@router.get("/training_runs", response_model=wire.TrainingRunsResponse)
def list_training_runs(
    session: SessionDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
    offset: Offset = 0,
) -> wire.TrainingRunsResponse:
    return tinker_checkpoints.list_training_runs(session, principal.organization_id, limit=limit, offset=offset)


@router.get("/training_runs/{model_id}", response_model=wire.TrainingRun)
def get_training_run(model_id: ModelId, session: SessionDep, principal: CurrentPrincipal) -> wire.TrainingRun:
    return tinker_checkpoints.get_training_run(session, principal.organization_id, model_id)


@router.get("/training_runs/{model_id}/checkpoints", response_model=wire.CheckpointsListResponse)
def list_checkpoints(
    model_id: ModelId, session: SessionDep, principal: CurrentPrincipal
) -> wire.CheckpointsListResponse:
    """A model's training states and sampler weights, oldest first."""
    return tinker_checkpoints.list_checkpoints(session, principal.organization_id, model_id)


CheckpointId = Annotated[
    str,
    Path(
        max_length=300,
        description="`weights/<name>`, `sampler_weights/<name>` or `external_weights/<name>`.",
    ),
]


# Routes under a checkpoint come before the delete route, whose `{checkpoint_id:path}` would match them.
@router.get(
    "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/external_weights_urls",
    response_model=wire.ExternalWeightsUrlsResponse,
)
def external_weights_urls(
    model_id: ModelId,
    checkpoint_id: CheckpointId,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> wire.ExternalWeightsUrlsResponse:
    """Short-lived signed URLs of exported weights' files, one per file, that need no key; each
    works while this key is valid and, for weights read through a publication, while it stands."""
    return tinker_checkpoints.external_weights_urls(
        session, settings, object_store_for(settings), principal, model_id, checkpoint_id
    )


@router.put("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/ttl", response_model=wire.Checkpoint)
def set_checkpoint_ttl(
    model_id: ModelId,
    checkpoint_id: CheckpointId,
    body: wire.CheckpointTtlRequest,
    session: SessionDep,
    principal: CurrentPrincipal,
) -> wire.Checkpoint:
    """Expire the checkpoint `ttl_seconds` from now (null: keep it); beat's retention deletes it then."""
    row = tinker_checkpoints.set_checkpoint_ttl(
        session, principal.organization_id, model_id, checkpoint_id, body.ttl_seconds
    )
    return tinker_checkpoints.checkpoint_view(row)


@router.post("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish", response_model=wire.Checkpoint)
def publish_checkpoint(
    model_id: ModelId, checkpoint_id: CheckpointId, session: SessionDep, principal: CurrentPrincipal
) -> wire.Checkpoint:
    """Let every organization read the checkpoint (load, sample, download it); only this one changes it.
    A copy of weights another organization published cannot be published (403)."""
    return tinker_checkpoints.checkpoint_view(
        tinker_checkpoints.set_published(session, principal, model_id, checkpoint_id, True)
    )


@router.delete("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish", response_model=wire.Checkpoint)
def unpublish_checkpoint(
    model_id: ModelId, checkpoint_id: CheckpointId, session: SessionDep, principal: CurrentPrincipal
) -> wire.Checkpoint:
    """Make a published checkpoint this organization's alone again: the copies other organizations
    took of it, and the download URLs they were given, end with the publication."""
    return tinker_checkpoints.checkpoint_view(
        tinker_checkpoints.set_published(session, principal, model_id, checkpoint_id, False)
    )


@router.delete(
    "/training_runs/{model_id}/checkpoints/{checkpoint_id:path}", response_model=wire.DeleteCheckpointResponse
)
def delete_checkpoint(
    model_id: ModelId,
    checkpoint_id: CheckpointId,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
) -> wire.DeleteCheckpointResponse:
    """Forget a checkpoint (sampler weights stay an adapter version in /v1/adapters)."""
    path = tinker_checkpoints.delete_checkpoint(
        session, object_store_for(settings), principal.organization_id, model_id, checkpoint_id
    )
    return wire.DeleteCheckpointResponse(tinker_path=str(path))


@router.get("/checkpoints", response_model=wire.CheckpointsListResponse)
def list_user_checkpoints(
    session: SessionDep,
    principal: CurrentPrincipal,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> wire.CheckpointsListResponse:
    """Every checkpoint of the organization, newest first."""
    return tinker_checkpoints.list_user_checkpoints(session, principal.organization_id, limit=limit, offset=offset)


@router.post("/weights_info", response_model=wire.WeightsInfoResponse)
def weights_info(
    body: wire.WeightsInfoRequest, session: SessionDep, principal: CurrentPrincipal
) -> wire.WeightsInfoResponse:
    return tinker_checkpoints.weights_info(session, principal.organization_id, body.tinker_path)


@router.get(
    "/tokenizers/{base_model}",
    response_class=StreamingResponse,
    responses=binary_response(TAR_MEDIA_TYPE, "The tokenizer files as a tar archive."),
)
def download_tokenizer(base_model: BaseName, settings: SettingsDep, _: CurrentPrincipal) -> StreamingResponse:
    """The base's tokenizer files (Mint's own route), streamed: unpack them into a folder and load
    it with `AutoTokenizer.from_pretrained(folder)` on a machine with no model hub."""
    stream = tinker_checkpoints.tokenizer_archive(settings, base_model)
    return stream_object(stream, media_type=TAR_MEDIA_TYPE, filename=f"{base_model}-tokenizer.tar")


@router.get(
    "/signed/{object_key:path}",
    response_class=StreamingResponse,
    responses=binary_response("application/octet-stream", "The object the signed URL names."),
)
def download_signed_object(
    object_key: Annotated[str, Path(max_length=1024, description="The object's key, as the signed URL names it.")],
    key_id: Annotated[
        str, Query(pattern=signed_urls.GRANT_ID_PATTERN, description="The API key the URL was issued to.")
    ],
    expires: Annotated[int, Query(ge=0, lt=2**40, description="When the URL expires (Unix seconds).")],
    signature: Annotated[str, Query(pattern="^[0-9a-f]{64}$", description="The URL's HMAC-SHA256, hex.")],
    session: SessionDep,
    settings: SettingsDep,
    publication: Annotated[
        str | None,
        Query(pattern=signed_urls.GRANT_ID_PATTERN, description="The published checkpoint the URL reads through."),
    ] = None,
) -> StreamingResponse:
    """An object for a download URL the API signed (exported weights' files, session traces): the
    URL is the credential (no key), valid until `expires` while the key it was issued to is, and
    the publication it reads through (if any) stands."""
    grant = signed_urls.Grant(key_id, publication)
    stream = signed_urls.signed_object(
        session, settings, object_store_for(settings), object_key, expires, signature, grant
    )
    return stream_object(stream, media_type="application/octet-stream", filename=object_key.rsplit("/", 1)[-1])


# ---- the presented key ------------------------------------------------------------------------


@router.get("/auth/apikey/me", response_model=wire.SelfApiKeyResponse)
def get_self_api_key(session: SessionDep, principal: CurrentPrincipal) -> wire.SelfApiKeyResponse:
    """The key this request carries (`tinker auth login` checks a pasted key with it)."""
    return tinker_checkpoints.self_api_key(session, principal)


@router.delete("/auth/apikey/me", response_model=wire.SelfApiKeyResponse)
def revoke_self_api_key(session: SessionDep, principal: CurrentPrincipal) -> wire.SelfApiKeyResponse:
    """Revoke the key this request carries, and only it (`tinker auth logout`); answers the key revoked."""
    auth.revoke_own_key(session, principal)
    return tinker_checkpoints.self_api_key(session, principal)
