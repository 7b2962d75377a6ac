"""Copies of published weights, through the official SDK's RestClient: a publication is lent,
not given.

Bob copies a checkpoint Alice published (`copy_weights`); the copy records where it comes
from. Bob can read it, but not publish it (403), nor a copy of his copy: only Alice says who
reads her weights. When Alice unpublishes or deletes the checkpoint, Bob's copies end with it,
while Alice's own copy of her own weights is an ordinary checkpoint of hers. A copy whose
origin goes another way (expired by retention) can no longer be read.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import tinker

from mint.config import Settings
from mint.services.upkeep.retention import expire_tinker_checkpoints
from mint.storage.objects import object_store_for
from tests.conftest import LiveServer, Tenant
from tests.tinker_compat.conftest import api
from tests.tinker_rows import saved_checkpoint

pytestmark = pytest.mark.torch


def run_of(path: str) -> str:
    return path.removeprefix("tinker://").split("/", 1)[0]


def readable(client: tinker.RestClient, path: str) -> bool:
    try:
        client.get_weights_info_by_tinker_path(path).result()
    except tinker.NotFoundError:
        return False
    return True


def test_a_copy_of_published_weights_cannot_be_republished_and_ends_with_the_publication(
    rest: Callable[[Tenant], tinker.RestClient], live_server: LiveServer, prepared: Settings, alice: Tenant, bob: Tenant
) -> None:
    original = saved_checkpoint(prepared, alice, kind="training", name="lent")
    alices, bobs = rest(alice), rest(bob)
    with pytest.raises(tinker.NotFoundError):  # not published yet: nothing to copy
        bobs.copy_weights(original, "borrowed").result()
    alices.publish_checkpoint_from_tinker_path(original).result()

    copy = bobs.copy_weights(original, "borrowed").result()
    copy_of_copy = bobs.copy_weights(copy, "borrowed-again").result()
    assert bobs.get_weights_info_by_tinker_path(copy).result().lora_rank == 4
    for path in (copy, copy_of_copy):
        with pytest.raises(tinker.PermissionDeniedError, match="another organization published") as refused:
            bobs.publish_checkpoint_from_tinker_path(path).result()
        assert original in str(refused.value)
    with api(live_server, bob) as http:  # the same answer on the route itself
        answer = http.post(f"/api/v1/training_runs/{run_of(copy)}/checkpoints/weights/lent/publish")
    assert answer.status_code == 403 and "only that organization can publish them" in answer.json()["error"]["message"]
    assert not any(c.public for c in bobs.list_checkpoints(run_of(copy)).result().checkpoints)

    # Alice's own copy of her own weights is hers to publish.
    own_copy = alices.copy_weights(original, "provenance-archive").result()
    alices.publish_checkpoint_from_tinker_path(own_copy).result()
    alices.unpublish_checkpoint_from_tinker_path(own_copy).result()

    # Unpublished: Bob's copies end (rows gone, nothing to read); Alice's copy stays.
    alices.unpublish_checkpoint_from_tinker_path(original).result()
    for path in (copy, copy_of_copy):
        assert not readable(bobs, path)
        assert bobs.list_checkpoints(run_of(path)).result().checkpoints == []
    assert readable(alices, own_copy) and readable(alices, original)
    with httpx.Client(base_url=live_server.url, headers={"X-API-Key": alice.keys["admin"]}, timeout=60) as http:
        audit = http.get("/v1/audit_log", params={"limit": 10}).json()["data"]
    unpublished = next(entry for entry in audit if entry["action"] == "tinker_checkpoint.unpublish")
    assert unpublished["data"] == {"path": original, "copies_ended": 2}

    # Published again and copied again: deleting the original ends the new copy too.
    alices.publish_checkpoint_from_tinker_path(original).result()
    assert not readable(bobs, copy)  # an ended copy does not come back
    again = bobs.copy_weights(original, "borrowed").result()
    alices.delete_checkpoint_from_tinker_path(original).result()
    assert not readable(bobs, again) and bobs.list_checkpoints(run_of(again)).result().checkpoints == []
    assert readable(alices, own_copy)  # its objects stay while her copy names them


def test_a_copy_whose_origin_expired_can_no_longer_be_read(
    rest: Callable[[Tenant], tinker.RestClient], prepared: Settings, alice: Tenant, bob: Tenant
) -> None:
    original = saved_checkpoint(prepared, alice, kind="training", name="expiring")
    alices, bobs = rest(alice), rest(bob)
    alices.publish_checkpoint_from_tinker_path(original).result()
    copy = bobs.copy_weights(original, "borrowed").result()
    assert readable(bobs, copy)
    alices.set_checkpoint_ttl_from_tinker_path(original, 60).result()
    expire_tinker_checkpoints(prepared.database, object_store_for(prepared), now=datetime.now(UTC) + timedelta(hours=1))
    assert not readable(alices, original)
    with pytest.raises(tinker.NotFoundError, match="no longer published"):
        bobs.get_weights_info_by_tinker_path(copy).result()
    with pytest.raises(tinker.PermissionDeniedError, match="since withdrawn"):
        bobs.publish_checkpoint_from_tinker_path(copy).result()
    bobs.delete_checkpoint_from_tinker_path(copy).result()  # an ended copy can still be cleared away
