"""OpenAI-compatible inference end to end: the official `openai` client against the API on a
real socket, which forwards to a real serving node process (`mint serve --base tiny-glm-moe`).

Adapter versions are made by a few real training steps on the tiny base in this process and
registered through the adapters service; the node fetches them from the object store.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from mint.config import Settings, get_settings
from mint.services import catalog
from mint.services.models import adapters
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import Adapter, ServingNode, UsageRecord
from tests.conftest import LiveServer, Tenant, make_tenant, serving_node, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.integration]

BASE = "tiny-glm-moe"
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def node(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """A serving node of the tiny base, registered in the session's database."""
    yield from serving_node(prepared, BASE)


@pytest.fixture(scope="module")
def owner(prepared: Settings) -> Tenant:
    return make_tenant(prepared)


def _train_version(settings: Settings, tenant: Tenant, resident: Any, folder: Path, answer: str) -> str:
    """A version of adapter `answers` trained for a few steps to answer QUESTION with `answer`."""
    from mint.chat.render import render_chat
    from mint.trainer.types import AdamParams, Datum, LoraOptions

    session = resident.create_session(LoraOptions(seed=len(answer)))  # seeded: the same adapter every run
    try:
        tokens, weights = render_chat(resident.tokenizer, [*QUESTION, {"role": "assistant", "content": answer}])
        datum = Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})
        for _ in range(12):
            session.forward_backward([datum], "cross_entropy")
            session.optim_step(AdamParams(learning_rate=1e-2))
        session.save_weights_for_sampler(folder)
    finally:
        resident.close(session.session_id)
    with session_scope(settings.database) as db:
        version = adapters.register_version(
            db,
            object_store_for(settings),
            organization_id=tenant.organization_id,
            name="answers",
            base_model=BASE,
            archive=adapters.archive_adapter(folder),
            lora={"rank": 16, "alpha": 32},
        )
        return catalog.model_ref_of(db.get(Adapter, version.adapter_id), version)


@pytest.fixture(scope="module")
def versions(prepared: Settings, owner: Tenant, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    import torch

    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resident = ResidentBase(
            get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models"), prepared.models_cache_dir
        )
        root = tmp_path_factory.mktemp("serving-adapters")
        return [_train_version(prepared, owner, resident, root / answer, answer) for answer in ("five", "It is 5.")]
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def client(live_server: LiveServer, owner: Tenant, node: Any) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=f"{live_server.url}/v1", api_key=owner.keys["developer"], max_retries=0)


def _ask(client: Any, model: str, **options: Any) -> Any:
    return client.chat.completions.create(model=model, messages=QUESTION, max_tokens=6, temperature=0, **options)


def test_base_and_adapter_versions_answer_and_say_what_served_them(client: Any, versions: list[str]) -> None:
    base = _ask(client, BASE)
    assert base.model_extra["mint"]["adapter"] is None and base.usage.completion_tokens >= 1
    answers = {}
    for ref in versions:
        reply = _ask(client, ref)
        assert reply.model_extra["mint"]["adapter"] == ref
        assert len(reply.model_extra["mint"]["adapter_sha256"]) == 64
        answers[ref] = reply.choices[0].message.content
    assert answers[versions[0]] != answers[versions[1]], answers
    # The same request again: served from the cache, the same greedy answer.
    assert _ask(client, versions[0]).choices[0].message.content == answers[versions[0]]


def test_streaming_gives_the_same_text_as_a_whole_response(client: Any, versions: list[str]) -> None:
    whole = _ask(client, versions[1]).choices[0].message.content
    chunks = list(_ask(client, versions[1], stream=True, stream_options={"include_usage": True}))
    assert chunks[0].model_extra["mint"]["adapter"] == versions[1]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_text_completions_models_and_errors(client: Any, versions: list[str], owner: Tenant) -> None:
    from openai import NotFoundError

    completion = client.completions.create(model=versions[0], prompt="Once upon a time", max_tokens=5, temperature=0)
    assert completion.usage.completion_tokens >= 1 and completion.model_extra["mint"]["adapter"] == versions[0]
    listed = {model.id for model in client.models.list()}
    assert {BASE, *versions} <= listed
    assert client.models.retrieve(versions[0]).id == versions[0]
    with pytest.raises(NotFoundError, match="no base model or adapter"):
        _ask(client, "nobody@1")
    from openai import OpenAI

    from tests.conftest import make_tenant

    stranger = make_tenant(get_settings())
    theirs = OpenAI(base_url=str(client.base_url), api_key=stranger.keys["developer"], max_retries=0)
    with pytest.raises(NotFoundError):  # another organization's adapter version does not exist for them
        _ask(theirs, versions[0])


# ---- logprobs and top_logprobs ------------------------------------------------------------------

TOP_K = 3
# The node's torch engine and a full softmax over one forward pass compute the same float32 numbers.
LOGPROB_TOLERANCE = 1e-4


class Reference:
    """The base loaded here with transformers: each step's full log_softmax, to check the node's numbers."""

    def __init__(self, settings: Settings) -> None:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        from mint.config import PROJECT_ROOT
        from mint.schemas.base_models import get_base_model_spec
        from mint.trainer.models import load_base_model

        spec = get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models")
        self.model, self.tokenizer = load_base_model(spec, settings.models_cache_dir)
        self.byte_encoder = bytes_to_unicode()
        self.added = {str(token): token_id for token_id, token in self.tokenizer.added_tokens_decoder.items()}

    def token_id(self, raw: bytes) -> int:
        """The vocabulary id of a token's exact bytes (byte-level BPE: one character per byte)."""
        text = raw.decode(errors="replace")
        if text in self.added:
            return self.added[text]
        return int(self.tokenizer.convert_tokens_to_ids("".join(self.byte_encoder[byte] for byte in raw)))

    def logprobs(self, prompt: list[int], tokens: list[int]) -> Any:
        """log_softmax at each completion token's step, (T, V), float32."""
        import torch

        with torch.no_grad():
            logits_1_L_V = self.model(input_ids=torch.tensor([prompt + tokens])).logits.float()
        return torch.log_softmax(logits_1_L_V[0, len(prompt) - 1 : -1], dim=-1)

    def check(self, prompt: list[int], entries: list[tuple[bytes, float, list[tuple[bytes, float]]]]) -> None:
        """Greedy entries (a token's bytes, its logprob, its top list): k sorted alternatives, the
        sampled token first, every number the full softmax's."""
        tokens = [self.token_id(raw) for raw, _, _ in entries]
        reference_T_V = self.logprobs(prompt, tokens)
        for step, ((raw, logprob, top), token) in enumerate(zip(entries, tokens, strict=True)):
            values = [value for _, value in top]
            assert len(top) == TOP_K and values == sorted(values, reverse=True)
            assert top[0] == (raw, logprob)  # temperature 0: the sampled token is the most likely one
            assert logprob == pytest.approx(float(reference_T_V[step, token]), abs=LOGPROB_TOLERANCE)
            best = reference_T_V[step].topk(TOP_K).values.tolist()
            assert values == pytest.approx(best, abs=LOGPROB_TOLERANCE)
            for other, value in top:
                assert value == pytest.approx(float(reference_T_V[step, self.token_id(other)]), abs=LOGPROB_TOLERANCE)


@pytest.fixture(scope="module")
def reference(prepared: Settings) -> Reference:
    return Reference(prepared)


def _check_text(tokens: list[str], raw: list[bytes], text: str) -> None:
    """Token texts add up to the completion's text (exactly when it is ASCII; by bytes otherwise)."""
    assert b"".join(raw).decode(errors="replace") == text
    if text.isascii():
        assert "".join(tokens) == text


def test_chat_logprobs_list_the_top_tokens_of_the_models_own_distribution(client: Any, reference: Reference) -> None:
    from mint.chat.render import render_prompt

    reply = _ask(client, BASE, logprobs=True, top_logprobs=TOP_K)
    content = reply.choices[0].logprobs.content
    assert content and len(content) <= reply.usage.completion_tokens
    entries = [(bytes(e.bytes), e.logprob, [(bytes(t.bytes), t.logprob) for t in e.top_logprobs]) for e in content]
    assert all(e.token == bytes(e.bytes).decode(errors="replace") for e in content)
    reference.check(render_prompt(reference.tokenizer, QUESTION), entries)
    _check_text([e.token for e in content], [bytes(e.bytes) for e in content], reply.choices[0].message.content)

    chunks = list(_ask(client, BASE, logprobs=True, top_logprobs=TOP_K, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, e.bytes, [t.token for t in e.top_logprobs]) for e in content
    ]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-6)

    assert _ask(client, BASE, logprobs=True).choices[0].logprobs.content[0].top_logprobs == []
    assert _ask(client, BASE).choices[0].logprobs is None


def test_top_logprobs_without_logprobs_is_a_400_that_says_to_set_it(client: Any) -> None:
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="set logprobs to true") as refused:
        _ask(client, BASE, top_logprobs=TOP_K)
    assert refused.value.status_code == 400
    with pytest.raises(BadRequestError, match="set logprobs to true"):
        _ask(client, BASE, logprobs=False, top_logprobs=0)


def test_completion_logprobs_in_openais_legacy_shape(client: Any, reference: Reference) -> None:
    prompt = "Once upon a time"
    completion = client.completions.create(model=BASE, prompt=prompt, max_tokens=6, temperature=0, logprobs=TOP_K)
    choice = completion.choices[0]
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) >= 1
    assert all("\ufffd" not in token for token in logprobs.tokens)  # whole characters: bytes are the texts'
    raw = [token.encode() for token in logprobs.tokens]
    entries = [
        (token, logprob, [(other.encode(), value) for other, value in top.items()])
        for token, logprob, top in zip(raw, logprobs.token_logprobs, logprobs.top_logprobs, strict=True)
    ]
    reference.check(list(reference.tokenizer(prompt, add_special_tokens=False)["input_ids"]), entries)
    _check_text(logprobs.tokens, raw, choice.text)
    # Characters from the start of the prompt, as OpenAI counts them.
    assert logprobs.text_offset == [len(prompt) + len("".join(logprobs.tokens[:i])) for i in range(len(raw))]

    chunks = list(
        client.completions.create(model=BASE, prompt=prompt, max_tokens=6, temperature=0, logprobs=TOP_K, stream=True)
    )
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for part in parts for t in part.tokens] == logprobs.tokens
    assert [o for part in parts for o in part.text_offset] == logprobs.text_offset
    assert [list(top) for part in parts for top in part.top_logprobs] == [list(top) for top in logprobs.top_logprobs]
    assert [v for part in parts for v in part.token_logprobs] == pytest.approx(logprobs.token_logprobs, abs=1e-6)

    bare = client.completions.create(model=BASE, prompt=prompt, max_tokens=2, temperature=0, logprobs=0)
    assert bare.choices[0].logprobs.top_logprobs is None and len(bare.choices[0].logprobs.token_logprobs) >= 1


def test_usage_counts_tokens_served(client: Any, versions: list[str], owner: Tenant, prepared: Settings) -> None:
    reply = _ask(client, versions[0])
    with session_scope(prepared.database) as session:
        served = (
            session.execute(
                select(UsageRecord).where(
                    UsageRecord.organization_id == owner.organization_id, UsageRecord.kind == "served"
                )
            )
            .scalars()
            .all()
        )
    assert served and served[-1].tokens == reply.usage.total_tokens and served[-1].model_ref == versions[0]


def test_a_stream_the_client_cuts_short_still_records_the_tokens_it_was_sent(
    live_server: LiveServer, node: Any, owner: Tenant, versions: list[str], prepared: Settings
) -> None:
    """The client reads the first chunk of a long stream and hangs up: the tokens generated for
    it so far are recorded as served usage, as a finished stream's are."""
    import httpx

    with session_scope(prepared.database) as session:
        before = len(_served_records(session, owner))
    body = {"model": versions[1], "messages": QUESTION, "max_tokens": 4096, "stream": True}
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=120)
    with api, api.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"

    def recorded() -> list[UsageRecord]:
        with session_scope(prepared.database) as session:
            return _served_records(session, owner)[before:]

    records = wait_for(recorded, "the usage of the stream cut short")
    assert len(records) == 1 and records[0].model_ref == versions[1], records
    assert records[0].tokens >= 1, records[0].tokens


def test_requests_during_promotions_and_rollbacks_are_each_served_wholly_by_one_version(
    client: Any, versions: list[str], owner: Tenant, live_server: LiveServer
) -> None:
    import httpx

    expected = {ref: _ask(client, ref).choices[0].message.content for ref in versions}
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    created = api.post("/v1/deployments", json={"name": "answers-prod", "model": versions[0]})
    assert created.status_code == 201, created.text
    stop, results, failures = threading.Event(), [], []

    def send() -> None:
        streaming = False
        while not stop.is_set():
            try:
                if streaming:
                    chunks = list(_ask(client, "answers-prod", stream=True))
                    served = chunks[0].model_extra["mint"]["adapter"]
                    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                else:
                    reply = _ask(client, "answers-prod")
                    served, text = reply.model_extra["mint"]["adapter"], reply.choices[0].message.content
                results.append((served, text))
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failures.append(repr(exc))
            streaming = not streaming

    senders = [threading.Thread(target=send) for _ in range(2)]
    for thread in senders:
        thread.start()

    def two_more() -> None:
        seen = len(results)
        wait_for(lambda: len(results) >= seen + 2, "two more requests")

    for change in ({"model": versions[1]}, None, {"model": versions[1]}, None):
        two_more()
        path = "promote" if change else "rollback"
        response = api.post(f"/v1/deployments/answers-prod/{path}", json=change or {})
        assert response.status_code == 200, response.text
    two_more()
    stop.set()
    for thread in senders:
        thread.join()
    assert failures == []
    assert {served for served, _ in results} == set(versions)
    assert all(text == expected[served] for served, text in results), results
    history = api.get("/v1/deployments/answers-prod/revisions").json()
    assert [r["action"] for r in history] == ["rollback", "promote", "rollback", "promote", "create"]


def test_a_mixture_deployment_routes_by_rule_and_is_evaluated_as_it_serves(
    client: Any, versions: list[str], live_server: LiveServer, owner: Tenant, workers: Any
) -> None:
    import httpx

    mixture = {
        "adapters": versions,
        "policy": {
            "type": "rules",
            "rules": [{"adapter": versions[1], "keywords": ["sentence"]}],
            "default": versions[0],
        },
    }
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    assert api.post("/v1/deployments", json={"name": "answers-mix", "mixture": mixture}).status_code == 201
    plain = _ask(client, "answers-mix")
    assert plain.model_extra["mint"]["adapter"] == versions[0]
    assert plain.model_extra["mint"]["route"]["decided_by"] == "default"
    routed = client.chat.completions.create(
        model="answers-mix",
        messages=[{"role": "user", "content": "What is 2 + 3? Answer in a sentence."}],
        max_tokens=4,
        temperature=0,
    )
    assert routed.model_extra["mint"]["adapter"] == versions[1]
    assert routed.model_extra["mint"]["route"]["decided_by"] == "rule"

    # The ruler measures the mixture as it serves: each task through its router, on the node,
    # and each trajectory says which adapter the router chose and why.
    tasks = [
        {"id": "plain", "messages": QUESTION, "reference": "5"},
        {"id": "sentence", "messages": [{"role": "user", "content": "What is 2 + 3? Answer in a sentence."}],
         "reference": "5"},
    ]  # fmt: skip
    content = "".join(json.dumps(task) + "\n" for task in tasks)
    bench = api.post("/v1/benchmarks", json={"name": "mix-ruler", "format": "jsonl", "content": content,
                                             "grader": {"type": "normalized"}}).json()  # fmt: skip
    workers.start("evals-of-mixtures")
    run = api.post("/v1/evals", json={"benchmark_id": bench["id"], "model": "answers-mix", "max_tokens": 4})
    assert run.status_code == 201, run.text
    pinned = run.json()["config"]["deployment"]["mixture"]
    assert pinned["spec"]["adapters"] == versions and pinned["spec"]["policy"]["default"] == versions[0]
    done = wait_for(
        lambda: (body := api.get(f"/v1/evals/{run.json()['id']}").json())["status"] in ("succeeded", "failed") and body,
        "the eval of the mixture",
    )
    assert done["status"] == "succeeded", done
    assert done["metrics"]["generator"] == "serving-node"
    routed = {
        t["task_id"]: [(r["step"], r["adapter"], r["route"]["decided_by"]) for r in t["routes"]]
        for t in api.get(f"/v1/evals/{done['id']}/trajectories").json()["data"]
    }
    assert routed == {"plain": [(0, versions[0], "default")], "sentence": [(0, versions[1], "rule")]}
    assert {adapter: part["tasks"] for adapter, part in done["metrics"]["routes"].items()} == {
        versions[0]: 1,
        versions[1]: 1,
    }


def test_admin_cache_stats_and_pins(client: Any, versions: list[str], owner: Tenant) -> None:
    import json

    from tests.test_cli import mint

    _ask(client, versions[0])
    _ask(client, versions[0])  # the second is an engine hit
    rows = json.loads(mint("admin", "cache", "stats", "--base", BASE, "--json").stdout)
    tiers = {row["tier"]: row for row in rows}
    assert set(tiers) == {"engine", "cpu", "ssd", "object_store"}
    assert tiers["engine"]["hits"] >= 1 and tiers["object_store"]["hits"] >= 1
    assert tiers["engine"]["entries"] >= 1 and tiers["object_store"]["promotion_ms"] is not None
    pinned = json.loads(mint("admin", "cache", "pin", versions[0], "--org", owner.name, "--json").stdout)
    assert len(pinned["pinned"]) == 64
    pinned_evict = mint("admin", "cache", "evict", versions[0], "--org", owner.name, check=False)
    assert pinned_evict.returncode == 5 and "unpin" in pinned_evict.stderr
    mint("admin", "cache", "unpin", versions[0], "--org", owner.name)
    evicted = json.loads(mint("admin", "cache", "evict", versions[0], "--org", owner.name, "--json").stdout)
    assert "engine" in evicted["evicted_from"]
    assert _ask(client, versions[0]).model_extra["mint"]["adapter"] == versions[0]  # fetched again
    not_an_adapter = mint("admin", "cache", "pin", BASE, "--org", owner.name, check=False)
    assert not_an_adapter.returncode == 6 and "not an adapter version" in not_an_adapter.stderr


def test_eval_runs_are_batched_through_the_serving_node(
    versions: list[str], owner: Tenant, live_server: LiveServer, node: Any, workers: Any
) -> None:
    """With a node of the base up, a worker's eval run sends its batches to the node's engine."""
    import httpx

    workers.start("evals-via-node")
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    tasks = "".join(
        json.dumps(
            {"id": f"q{n}", "messages": [{"role": "user", "content": f"What is {n} + 3?"}], "reference": str(n + 3)}
        )
        + "\n"
        for n in range(6)
    )
    benchmark = api.post(
        "/v1/benchmarks", json={"name": "via-node", "format": "jsonl", "content": tasks, "grader": {"type": "numeric"}}
    ).json()
    run = api.post("/v1/evals", json={"benchmark_id": benchmark["id"], "model": versions[0], "max_tokens": 4}).json()
    done = wait_for(
        lambda: (body := api.get(f"/v1/evals/{run['id']}").json())["status"] in ("succeeded", "failed") and body,
        "the eval run",
    )
    assert done["status"] == "succeeded", done
    assert done["metrics"]["generator"] == "serving-node" and done["tasks_done"] == 6
    trajectories = api.get(f"/v1/evals/{run['id']}/trajectories?limit=10").json()["data"]
    assert all(t["tokens_out"] >= 1 and t["tokens_in"] > 0 for t in trajectories)


def _set_node_token(settings: Settings, node_id: str, token: str | None) -> None:
    with session_scope(settings.database) as session:
        row = session.get(ServingNode, node_id)
        assert row is not None
        row.token = token


def test_the_node_answers_only_with_its_credential_and_the_api_presents_it(
    versions: list[str], owner: Tenant, live_server: LiveServer, node: subprocess.Popen[bytes], prepared: Settings
) -> None:
    """The node process refuses its internal routes without the token it recorded; the API
    presents that token, and where it is not the node's, the client gets a 503 that names the
    node, never where it is."""
    import httpx

    with session_scope(prepared.database) as session:
        row = session.execute(select(ServingNode).where(ServingNode.pid == node.pid)).scalar_one()
        node_id, url, token = row.id, row.url, row.token
    assert token
    body = {"prompt": "Hi", "max_tokens": 1, "adapter": None}
    assert httpx.post(f"{url}/internal/v1/complete", json=body).status_code == 401
    assert httpx.get(f"{url}/internal/v1/cache", headers={"Authorization": "Bearer not-it"}).status_code == 401
    assert httpx.get(f"{url}/internal/v1/cache", headers={"Authorization": f"Bearer {token}"}).status_code == 200

    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    question = {"model": versions[0], "messages": QUESTION, "max_tokens": 2}
    _set_node_token(prepared, node_id, "a-token-that-is-not-the-node-s-own")
    try:
        for stream in (False, True):
            refused = api.post("/v1/chat/completions", json={**question, "stream": stream})
            assert refused.status_code == 503, refused.text
            assert node_id in refused.json()["error"]["message"] and "MINT_NODE_TOKEN" in refused.text
            assert url not in refused.text and url.rsplit(":", 1)[1] not in refused.text
    finally:
        _set_node_token(prepared, node_id, token)
    assert api.post("/v1/chat/completions", json=question).status_code == 200


@pytest.fixture
def one_connection(prepared: Settings) -> Iterator[None]:
    """This process's database pool (the API's, on the live server) cut to one connection,
    no overflow, and one second's wait for it."""
    from mint.storage.db import PoolOptions, configure_pool

    configure_pool(prepared.database, PoolOptions(size=1, max_overflow=0, timeout_s=1.0))
    try:
        yield
    finally:
        configure_pool(prepared.database, PoolOptions())


@pytest.mark.usefixtures("one_connection")
def test_concurrent_completions_beyond_the_database_pool_all_succeed(
    client: Any, versions: list[str], owner: Tenant, prepared: Settings
) -> None:
    """A request holds a pooled connection only to authenticate, resolve its model and record
    its usage, never while the node generates: 12 requests share one connection."""
    count = 12
    barrier = threading.Barrier(count)
    replies: list[tuple[str, int]] = []
    failures: list[str] = []

    def send(index: int) -> None:
        model = versions[index % 2]
        barrier.wait()
        try:
            if index % 3 == 0:
                chunks = list(_ask(client, model, stream=True, stream_options={"include_usage": True}))
                assert chunks[0].model_extra["mint"]["adapter"] == model
                replies.append((model, chunks[-1].usage.total_tokens))
            else:
                reply = _ask(client, model)
                assert reply.model_extra["mint"]["adapter"] == model
                replies.append((model, reply.usage.total_tokens))
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            failures.append(repr(exc))

    with session_scope(prepared.database) as session:
        before = _served_records(session, owner)
    senders = [threading.Thread(target=send, args=(index,)) for index in range(count)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()
    assert failures == [] and len(replies) == count
    with session_scope(prepared.database) as session:
        recorded = _served_records(session, owner)[len(before) :]
    assert sorted((r.model_ref, r.tokens) for r in recorded) == sorted(replies)  # streams' usage too


def _served_records(session: Any, owner: Tenant) -> list[UsageRecord]:
    query = select(UsageRecord).where(
        UsageRecord.organization_id == owner.organization_id, UsageRecord.kind == "served"
    )
    return list(session.execute(query.order_by(UsageRecord.created_at, UsageRecord.id)).scalars())


BUSY_BASE = "tiny-qwen3-moe"


@pytest.fixture(scope="module")
def busy_node(prepared: Settings) -> Iterator[subprocess.Popen[bytes]]:
    """A node of another base with room for little: one request per batch, one waiting."""
    yield from serving_node(prepared, BUSY_BASE, {"MINT_SERVING_BATCH_SIZE": "1", "MINT_SERVING_MAX_WAITING": "1"})


def test_a_node_with_a_full_queue_gives_429_with_retry_after(
    busy_node: Any, live_server: LiveServer, owner: Tenant
) -> None:
    """Two batchers of one request and one waiting: of 12 long requests sent at once, the node
    refuses some, and the API answers those with 429 and Retry-After, never 500."""
    import httpx

    count = 12
    barrier = threading.Barrier(count)
    answers: list[httpx.Response] = []

    def send(index: int) -> None:
        body = {"model": BUSY_BASE, "messages": QUESTION, "max_tokens": 200, "stream": index % 2 == 0}
        with httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=120) as api:
            barrier.wait()
            response = api.post("/v1/chat/completions", json=body)
            answers.append(response)

    senders = [threading.Thread(target=send, args=(index,)) for index in range(count)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()
    statuses = sorted(response.status_code for response in answers)
    assert set(statuses) == {200, 429}, statuses
    for response in answers:
        if response.status_code == 429:
            assert response.headers["Retry-After"] == "1"
            error = response.json()["error"]
            assert error["type"] == "rate_limit_error" and "MINT_SERVING_MAX_WAITING" in error["message"], error


def test_a_capturing_deployment_records_what_it_served_and_takes_feedback_even_from_viewers(
    client: Any, versions: list[str], owner: Tenant, live_server: LiveServer
) -> None:
    import httpx

    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    created = api.post("/v1/deployments", json={"name": "captured-prod", "model": versions[0]}).json()
    assert created["capture"] == {"rate": 0.0, "retention_days": 30, "tokens": False}
    quiet = _ask(client, "captured-prod")
    assert api.get(f"/v1/captures/{quiet.id}").status_code == 404  # capture is opt-in

    set_ = api.patch(f"/v1/deployments/{created['id']}/capture", json={"rate": 1.0, "retention_days": 7})
    assert set_.status_code == 200, set_.text
    assert set_.json()["capture"] == {"rate": 1.0, "retention_days": 7, "tokens": False}
    reply = _ask(client, "captured-prod")
    chunks = list(_ask(client, "captured-prod", stream=True))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def captured(completion_id: str) -> dict[str, Any] | None:
        response = api.get(f"/v1/captures/{completion_id}")
        return response.json() if response.status_code == 200 else None

    record = wait_for(lambda: captured(reply.id), "the capture to be written")
    assert record["model"] == versions[0] and record["kind"] == "chat" and record["revision"] == 1
    assert record["request"]["messages"] == QUESTION and record["request"]["max_tokens"] == 6
    assert record["response"]["choices"][0]["message"]["content"] == reply.choices[0].message.content
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    assert record["latency_ms"] > 0 and record["feedback"] == []
    streamed = wait_for(lambda: captured(chunks[0].id), "the streamed capture")
    assert streamed["response"]["choices"][0]["message"]["content"] == streamed_text

    viewer = httpx.Client(base_url=live_server.url, headers=owner.headers("viewer"), timeout=60)
    correction = {"message": {"role": "assistant", "content": "5"}}
    given = viewer.post(
        f"/v1/captures/{reply.id}/feedback", json={"score": 0.0, "label": "wrong", "correction": correction}
    )
    assert given.status_code == 201, given.text
    assert viewer.post(f"/v1/deployments/{created['id']}/capture", json={"rate": 0}).status_code in (403, 405)
    bad = viewer.post(f"/v1/captures/{reply.id}/feedback", json={"correction": {"text": "5"}})
    assert bad.status_code == 400 and "a correction of a chat completion is {'message': ...}" in bad.text
    empty = viewer.post(f"/v1/captures/{reply.id}/feedback", json={})
    assert empty.status_code == 400 and "give a score, a label, a comment or a correction" in empty.text

    listed = api.get(f"/v1/deployments/{created['id']}/captures").json()["data"]
    assert [entry["id"] for entry in listed] == [chunks[0].id, reply.id]
    (feedback,) = listed[1]["feedback"]
    assert feedback == {
        **feedback,
        "score": 0.0,
        "label": "wrong",
        "correction": correction,
        "created_by": "viewer key",
    }
    metrics = httpx.get(f"{live_server.url}/metrics").text
    assert "mint_captures_written_total" in metrics

    # Production into data: the corrected capture (not the one only scored) as SFT rows and a DPO pair.
    sft = api.post("/v1/datasets/from-captures", json={"deployment": "captured-prod", "kind": "chat"})
    assert sft.status_code == 201, sft.text
    assert (sft.json()["row_count"], sft.json()["kind"], sft.json()["skipped"]) == (1, "chat", [])
    rows = [json.loads(line) for line in api.get(f"/v1/files/{sft.json()['id']}/content").text.splitlines()]
    assert rows == [{"messages": [*QUESTION, {"role": "assistant", "content": "5"}]}]
    pair = api.post("/v1/datasets/from-captures", json={"deployment": "captured-prod", "kind": "preference"})
    served_text = reply.choices[0].message.content
    if served_text:  # a DPO pair: the correction over what was served
        pair_row = json.loads(api.get(f"/v1/files/{pair.json()['id']}/content").text)
        assert pair_row["preferred_output"][0]["content"] == "5"
        assert pair_row["non_preferred_output"][0]["content"] == served_text
    else:  # the tiny adapter answered nothing: there is nothing to prefer the correction over
        assert pair.status_code == 400 and "there is no output to reject" in pair.text, pair.text
    nothing = api.post("/v1/datasets/from-captures", json={"kind": "chat", "label": "no-such-label"})
    assert nothing.status_code == 400 and "mining needs captures whose feedback gives a correction" in nothing.text
    other = make_tenant(get_settings())
    foreign = httpx.post(
        f"{live_server.url}/v1/datasets/from-captures",
        headers=other.headers("developer"),
        json={"deployment": "captured-prod", "kind": "chat"},
    )
    assert foreign.status_code == 404, foreign.text

    # ... and into the ruler: the benchmark's next version holds the corrected request as a task.
    task = {"id": "sum", "messages": QUESTION, "reference": "5"}
    bench = api.post("/v1/benchmarks", json={"name": "prod-ruler", "format": "jsonl", "content": json.dumps(task),
                                             "grader": {"type": "exact"}}).json()  # fmt: skip
    grown = api.post(f"/v1/benchmarks/{bench['id']}/versions/from-captures", json={"deployment": "captured-prod"})
    assert grown.status_code == 201, grown.text
    assert (
        grown.json()["version"] == 2
        and grown.json()["splits"] == {"production": 1, "unsplit": 1}
        or grown.json()["task_count"] == 2
    )
    again = api.post(f"/v1/benchmarks/{bench['id']}/versions/from-captures", json={"deployment": "captured-prod"})
    assert again.status_code == 400 and "already a task of this benchmark" in again.text


class HeldCaptureWriter:
    """The app's capture writer, made slower than any client: each batch is held until a request
    waits for its capture (an answer sent only once its capture is written) or until the test
    has posted its feedback (a writer left behind the request path, as it was)."""

    def __init__(self, settings: Settings) -> None:
        from mint.services.serving.captures import CaptureWriter

        self.release = threading.Event()
        release = self.release

        class Held(CaptureWriter):
            def _write(self, batch: list[Any]) -> None:
                release.wait()
                super()._write(batch)

            async def landed(self, receipt: Any, timeout_s: float) -> bool:
                release.set()  # a request waits for its capture: the writer goes on
                return await super().landed(receipt, timeout_s)

        self.writer = Held(settings.database)


def test_feedback_posted_the_moment_the_answer_arrives_finds_its_capture(
    client: Any, versions: list[str], owner: Tenant, live_server: LiveServer, app: Any
) -> None:
    """An application posting feedback as soon as it shows a completion of a capturing deployment
    got "no captured completion": the capture was written behind the request path, after the
    answer. The writer here is held until the feedback has been posted, unless a request waits
    for it; the answer (whole, or a stream's last chunk) now comes only once its capture is
    written, so the feedback finds it every time."""
    import httpx

    held = HeldCaptureWriter(get_settings())
    # Set and put back by hand: the app's state keeps its attributes outside `__dict__`, where
    # pytest's monkeypatch would look for the one to put back, and delete it instead.
    original, app.state.capture_writer = app.state.capture_writer, held.writer
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    viewer = httpx.Client(base_url=live_server.url, headers=owner.headers("viewer"), timeout=60)
    created = api.post("/v1/deployments", json={"name": "feedback-at-once", "model": versions[0]}).json()
    api.patch(f"/v1/deployments/{created['id']}/capture", json={"rate": 1.0}).raise_for_status()
    try:
        whole = _ask(client, "feedback-at-once")
        given = viewer.post(f"/v1/captures/{whole.id}/feedback", json={"score": 0.0, "label": "at-once"})
        assert given.status_code == 201, given.text
        streamed = list(_ask(client, "feedback-at-once", stream=True))
        given = viewer.post(f"/v1/captures/{streamed[0].id}/feedback", json={"score": 1.0})
        assert given.status_code == 201, given.text
        assert held.writer.written == 2 and held.writer.dropped == 0

        # A completion the deployment did not choose says so, and why, rather than "not yet".
        api.patch(f"/v1/deployments/{created['id']}/capture", json={"rate": 1e-9}).raise_for_status()
        unchosen = _ask(client, "feedback-at-once")
        refused = viewer.post(f"/v1/captures/{unchosen.id}/feedback", json={"score": 0.0})
        assert refused.status_code == 404, refused.text
        message = refused.json()["error"]["message"]
        assert f"completion {unchosen.id!r} was not captured" in message, message
        assert "'feedback-at-once' a share of 1e-09" in message, message
        assert held.writer.written == 2  # nothing was offered for it
    finally:
        held.release.set()
        held.writer.flush()
        app.state.capture_writer = original


PRODUCTION_REQUESTS = ["Confirm the order.", "Is the service up?", "Acknowledge this.", "Can you hear me?",
                       "Ready?", "Did it arrive?", "Reply please.", "All set?"]  # fmt: skip


@pytest.mark.long_run
def test_production_feedback_becomes_the_next_version_that_fixes_what_it_corrected_on_the_same_ruler(
    versions: list[str], owner: Tenant, live_server: LiveServer, node: Any, workers: Any
) -> None:
    """The loop from production: serve, capture, correct, mine into data and into the ruler,
    train the next version from the one in production, and measure both on the grown ruler."""
    import httpx

    from mint.sdk import Mint

    workers.start("production-loop")
    api = httpx.Client(base_url=live_server.url, headers=owner.headers("developer"), timeout=60)
    api.post("/v1/deployments", json={"name": "loop-prod", "model": versions[0]}).raise_for_status()
    api.patch("/v1/deployments/loop-prod/capture", json={"rate": 1.0}).raise_for_status()
    with (
        Mint(live_server.url, owner.keys["developer"]) as user,
        Mint(live_server.url, owner.keys["viewer"]) as reviewer,
    ):
        for text in PRODUCTION_REQUESTS:
            answer = user.chat.create(model="loop-prod", messages=[{"role": "user", "content": text}], max_tokens=4)
            wait_for(lambda answer=answer: api.get(f"/v1/captures/{answer.id}").status_code == 200, "the capture")
            correction = {"message": {"role": "assistant", "content": "OK"}}
            reviewer.captures.feedback(answer.id, score=0.0, label="should-acknowledge", correction=correction)

    with Mint(live_server.url, owner.keys["developer"]) as sdk:
        mined = sdk.captures.to_dataset("chat", deployment="loop-prod", label="should-acknowledge")
        assert mined.row_count == len(PRODUCTION_REQUESTS) and mined.skipped == []
        seed = {"id": "seed", "messages": [{"role": "user", "content": "Hello?"}], "reference": "OK"}
        ruler = sdk.benchmarks.create(
            "production-ruler", content=json.dumps(seed), format="jsonl", grader={"type": "normalized"}
        )
        grown = sdk.captures.to_benchmark(ruler.id, deployment="loop-prod")
        assert (grown.version, grown.task_count, grown.splits.get("production")) == (2, 9, 8)

        before = sdk.evals.create(ruler.id, "loop-prod", max_tokens=4).wait()  # what production serves
        assert before.model == versions[0] and before.config["deployment"] == {
            **before.config["deployment"],
            "name": "loop-prod",
            "revision": 1,
        }
        # The next version of the adapter in production (a new version of `answers`).
        job = sdk.jobs.create(BASE, mined.id, suffix="answers", steps=24, learning_rate=3e-3, seed=1,
                              hyperparameters={"batch_size": 8}).wait()  # fmt: skip
        assert job.status == "succeeded" and job.fine_tuned_model == "answers@3"
        after = sdk.evals.create(ruler.id, job.fine_tuned_model, max_tokens=4).wait()
        comparison = sdk.evals.compare(before.id, after.id)
    assert before.benchmark_version_id == after.benchmark_version_id == grown.id
    production = {request_id for request_id in comparison.fixed if request_id != "seed"}
    print(f"\nproduction loop: fixed {len(comparison.fixed)}, broken {len(comparison.broken)}, "
          f"delta {comparison.accuracy_delta:+.2f}")  # fmt: skip
    assert len(production) >= len(PRODUCTION_REQUESTS) // 2 and comparison.broken == []
    assert comparison.significant


def test_a_repeated_prompt_reports_its_cached_tokens(client: Any) -> None:
    """The node's prompt cache: the second request of a prompt reads its whole blocks back
    (16 tokens each, the last prompt token always run) and says so in OpenAI's usage field."""
    prompt = "A prompt cache check. " + " ".join(f"word{i}" for i in range(30))
    first = client.completions.create(model=BASE, prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model=BASE, prompt=prompt, max_tokens=2, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == (second.usage.prompt_tokens - 1) // 16 * 16 > 0
    assert second.choices[0].text == first.choices[0].text
    chunks = list(
        client.completions.create(
            model=BASE, prompt=prompt, max_tokens=2, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens_details.cached_tokens
