"""Tinker projects, session search and copied weights through the official SDK's RestClient:
a project is a label on an organization's sessions, search filters and pages them, and
`copy_weights` files a checkpoint into a new run that shares its stored objects."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tinker
from tinker import types

from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import BASE, TinkerWorker, api

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:RestClient.search_sessions is experimental")]


def session_of(model_id: str) -> str:
    return model_id.split(":", 1)[0]  # a model id is <session>:train:<n>


def test_projects_label_sessions_search_pages_them_and_copies_share_their_objects(
    connect: Callable[[Tenant], tinker.ServiceClient],
    live_server: LiveServer,
    alice: Tenant,
    bob: Tenant,
    tinker_worker: TinkerWorker,
) -> None:
    research = tinker.ServiceClient(
        base_url=live_server.url,
        api_key=alice.keys["developer"],
        project_id="research",
        display_name="Nightly sweep",
        user_metadata={"team": "nlp"},
    )
    training = research.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
    state = training.save_state("kept").result().path
    sweep = session_of(training.model_id)
    rest = tinker.RestClient(base_url=live_server.url, api_key=alice.keys["developer"])

    found = rest.search_sessions(types.SessionSearchRequest(project_ids=["research"])).result()
    assert [summary.session_id for summary in found.sessions] == [sweep] and found.next_cursor is None
    summary = found.sessions[0]
    assert (summary.project_id, summary.display_name, summary.user_metadata) == (
        "research",
        "Nightly sweep",
        {"team": "nlp"},
    )
    assert summary.checkpoints_count == 1 and summary.checkpoint_storage_bytes and summary.status is not None
    assert summary.status.type == "active"
    # Each word of a display name, in any case; exact metadata pairs; statuses.
    by_name = rest.search_sessions(types.SessionSearchRequest(display_name="SWEEP nightly")).result()
    assert [s.session_id for s in by_name.sessions] == [sweep]
    assert not rest.search_sessions(types.SessionSearchRequest(user_metadata={"team": "vision"})).result().sessions
    finished = types.SessionSearchRequest(project_ids=["research"], statuses=[types.ClientFinishedSessionStatusQuery()])
    assert not rest.search_sessions(finished).result().sessions

    # A session of the default project moves into "research"; pages of one follow the cursor.
    other = connect(alice)
    other_model = other.create_lora_training_client(base_model=BASE, rank=4, seed=2).result()
    moved = session_of(other_model.model_id)
    default = rest.search_sessions(types.SessionSearchRequest(project_ids=["default"], limit=200)).result()
    assert moved in {s.session_id for s in default.sessions}
    rest.assign_session_project(moved, "research").result()
    request = types.SessionSearchRequest(project_ids=["research"], limit=1)
    pages = []
    while True:
        page = rest.search_sessions(request).result()
        pages.append([s.session_id for s in page.sessions])
        if page.next_cursor is None:
            break
        request = request.model_copy(update={"cursor": page.next_cursor})
    assert pages == [[moved], [sweep]]  # newest first
    with pytest.raises(tinker.BadRequestError, match="organizations, not users"):
        rest.search_sessions(
            types.SessionSearchRequest(owner=types.UserSearchOwner(owner_urns=["user:someone"]))
        ).result()

    # A copy: a new run that cannot be trained on, in the named project, sharing the state's objects.
    copied = rest.copy_weights(state, "archive", ttl_seconds=7200).result()
    assert copied != state and copied.endswith("/weights/kept")
    archive = rest.search_sessions(types.SessionSearchRequest(project_ids=["archive"])).result().sessions
    assert [summary.checkpoints_count for summary in archive] == [1]
    copy_run = copied.removeprefix("tinker://").split("/")[0]
    listed = rest.list_checkpoints(copy_run).result().checkpoints
    assert [(c.tinker_path, c.expires_at is not None) for c in listed] == [(copied, True)]
    with api(live_server, alice) as http:  # a copy is published like any checkpoint of the organization
        published = http.post(f"/api/v1/training_runs/{copy_run}/checkpoints/weights/kept/publish")
        assert published.status_code == 200, published.text
    # The source goes; the copy still loads, since its objects stay while a row names them.
    rest.delete_checkpoint_from_tinker_path(state).result()
    restored = research.create_training_client_from_state(copied).result()
    assert restored.get_info().lora_rank == 4
    # Another organization neither finds these sessions nor copies what is not published.
    theirs = tinker.RestClient(base_url=live_server.url, api_key=bob.keys["developer"])
    everything = types.SessionSearchRequest(owner=types.AccessibleSearchOwner(), limit=200)
    assert not {sweep, moved} & {s.session_id for s in theirs.search_sessions(everything).result().sessions}
    with pytest.raises(tinker.NotFoundError):
        theirs.assign_session_project(sweep, "stolen").result()
    with pytest.raises(tinker.NotFoundError):
        theirs.copy_weights(training.save_state("private").result().path, "mine").result()
    research.close("success").result()
