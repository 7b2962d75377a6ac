"""The serving node (`mint.serving.node.ServingNode`) on each engine of `ENGINE_FACTORIES`, and
the choice of engine a node makes (`mint.serving.engines`).

A node serves adapter versions that exist only in the object store, as a job leaves them:
the first request fetches a version through the adapter cache into an engine slot and is
answered with exactly peft's tokens for that adapter. A restarted node adopts the copies the
previous one left on its SSD and serves from them without the object store.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mint.config import PROJECT_ROOT
from mint.errors import ConfigurationError
from mint.schemas.base_models import get_base_model_spec
from mint.schemas.inference import AdapterOnNode
from mint.schemas.node import NodeCompletion, NodeMixture
from mint.services.models.adapters import archive_adapter
from mint.serving import engines
from mint.serving.embeddings import SentenceEncoder
from mint.serving.engine import Engine
from mint.serving.node import ServingNode
from mint.serving.torch_engine import TorchEngine
from mint.storage.objects import LocalObjectStore

if TYPE_CHECKING:
    from tests.serving.conftest import AdapterKit, EngineFactory

pytestmark = [pytest.mark.backend_free, pytest.mark.torch]

CONFIGS = PROJECT_ROOT / "configs" / "models"
PROMPT = "Write the names of three rivers:"
MAX_TOKENS = 6


def store_version(store: LocalObjectStore, folder: Path, name: str) -> AdapterOnNode:
    """Store an adapter folder as a finished job does: one archive, named to nodes by its sha256."""
    archive = archive_adapter(folder)
    key = f"adapters/{name}/1/adapter.tar"
    store.put_bytes(key, archive)
    return AdapterOnNode(ref=f"{name}@1", sha256=hashlib.sha256(archive).hexdigest(), object_key=key)


def ask(node: ServingNode, adapter: AdapterOnNode | None) -> list[int]:
    request = NodeCompletion(
        messages=None,
        prompt=PROMPT,
        tools=None,
        adapter=adapter,
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        top_p=1.0,
        seed=0,
        stop=[],
    )
    return node.complete(request)[0].token_ids


def test_a_node_serves_stored_versions_and_after_a_restart_serves_its_ssd_copies(
    engine_factory: EngineFactory, engine: Engine, kit: AdapterKit, tmp_path: Path
) -> None:
    spec = get_base_model_spec(engine_factory.base, CONFIGS)
    store = LocalObjectStore(tmp_path / "objects")
    versions = {name: store_version(store, kit[name].folder, name) for name in ("alpha", "beta")}
    prompt = list(engine.tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    expected = {name: kit.reference(name, prompt, MAX_TOKENS).tokens for name in (None, "alpha", "beta")}

    node = ServingNode(spec, engine, store, ssd_dir=tmp_path / "ssd")
    try:
        for name, version in versions.items():
            assert ask(node, version) == expected[name], f"{name} through the node differs from peft"
        assert ask(node, None) == expected[None]
        stats = node.cache.stats()
        assert stats.tier("object_store").hits == 2 and stats.tier("engine").resident_entries == 2
        assert stats.leases == 0
    finally:
        node.close()
    node.ssd.flush()

    # A new node process: the engine's slots are empty and the object store has lost the versions.
    for info in engine.adapters():
        engine.remove_adapter(info.adapter_id)
    for version in versions.values():
        store.delete(version.object_key)
    restarted = ServingNode(spec, engine, store, ssd_dir=tmp_path / "ssd")
    try:
        assert restarted.cache.stats().tier("ssd").resident_entries == 2
        for name, version in versions.items():
            assert ask(restarted, version) == expected[name]
        assert restarted.cache.stats().tier("ssd").hits == 2
    finally:
        restarted.close()


def test_a_node_names_each_tokens_text_and_bytes_in_its_logprobs(
    engine_factory: EngineFactory, engine: Engine, tmp_path: Path
) -> None:
    spec = get_base_model_spec(engine_factory.base, CONFIGS)
    node = ServingNode(spec, engine, LocalObjectStore(tmp_path / "objects"), ssd_dir=tmp_path / "ssd")
    try:
        request = NodeCompletion(
            prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, seed=0, logprobs=True, top_logprobs=2
        )
        events = list(node.stream(request))
        content = [entry for event in events for entry in node.logprobs_content(event)]
        (whole,) = node.complete(request)
        assert len(content) == len(whole.token_ids) == MAX_TOKENS and whole.finish_reason == "length"
        assert [entry["logprob"] for entry in content] == pytest.approx(whole.logprobs, abs=1e-3)
        assert b"".join(bytes(entry["bytes"]) for entry in content).decode(errors="replace") == whole.text
        for entry in content:
            assert entry["token"] == bytes(entry["bytes"]).decode(errors="replace")
            first = entry["top_logprobs"][0]  # greedy: the sampled token is the most likely one
            assert len(entry["top_logprobs"]) == 2
            assert (first["token"], first["bytes"], first["logprob"]) == (
                entry["token"],
                entry["bytes"],
                entry["logprob"],
            )

        # A character split across tokens: `bytes` is exact, `token` the lossy text, as OpenAI gives them.
        text = "日本 — “quote”"
        tokens = list(node.tokenizer(text, add_special_tokens=False)["input_ids"])
        pieces = [node.token_text.bytes_of(token) for token in tokens]
        assert b"".join(pieces) == text.encode()
        assert any("\ufffd" in node.token_text.text_of(token) for token in tokens)

        # The stop token that ended a completion is not part of its text, nor of its logprobs.
        end = node.tokenizer.convert_tokens_to_ids("<|im_end|>")
        event = whole.model_copy(
            update={
                "token_ids": [*whole.token_ids[:2], end],
                "logprobs": [*whole.logprobs[:2], -0.5],
                "top_logprobs": [],
                "finish_reason": "stop",
                "stop_match": end,
            }
        )
        assert [entry["token"] for entry in node.logprobs_content(event)] == [e["token"] for e in content[:2]]
        assert node.token_text.text_of(end) == "<|im_end|>"
    finally:
        node.close()


# ---- which engine a node runs -----------------------------------------------------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA GPU, as `choose_engine` sees it: faked, since this suite runs on machines without one."""
    monkeypatch.setattr(engines, "_has_cuda", lambda: True)


def test_auto_runs_the_torch_engine_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_has_cuda", lambda: False)
    dense = get_base_model_spec("smollm2-135m-instruct", CONFIGS)
    assert engines.choose_engine(dense, "auto", vllm_python=Path("/opt/vllm/bin/python")) == "torch"
    assert engines.choose_engine(dense, "vllm", vllm_python=Path("/opt/vllm/bin/python")) == "vllm"


@pytest.mark.usefixtures("gpu")
def test_auto_runs_vllm_on_a_gpu_where_vllm_is() -> None:
    moe = get_base_model_spec("tiny-glm-moe", CONFIGS)
    assert engines.choose_engine(moe, "auto", vllm_python=Path("/opt/vllm/bin/python")) == "vllm"
    assert engines.choose_engine(moe, "torch", vllm_python=Path("/opt/vllm/bin/python")) == "torch"


def test_vllm_is_refused_where_it_cannot_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_has_cuda", lambda: False)
    moe = get_base_model_spec("tiny-glm-moe", CONFIGS)
    with pytest.raises(ConfigurationError, match="experts only on a GPU"):
        engines.choose_engine(moe, "vllm", vllm_python=Path("/opt/vllm/bin/python"))
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None)  # no vllm in this venv
    with pytest.raises(ConfigurationError, match="MINT_VLLM_PYTHON"):
        engines.choose_engine(moe, "vllm", vllm_python=None)
    assert engines.choose_engine(moe, "auto", vllm_python=None) == "torch"


@pytest.mark.usefixtures("gpu")
def test_auto_keeps_a_base_on_the_torch_engine_where_its_profile_says_so() -> None:
    moe = get_base_model_spec("tiny-glm-moe", CONFIGS)
    torch_profile = moe.serving.model_copy(update={"engine": "torch"})
    on_torch = moe.model_copy(update={"serving": torch_profile})
    assert engines.choose_engine(on_torch, "auto", vllm_python=Path("/opt/vllm/bin/python")) == "torch"
    assert engines.choose_engine(on_torch, "vllm", vllm_python=Path("/opt/vllm/bin/python")) == "vllm"


def test_a_node_with_the_torch_engine_embeds_for_its_router_where_the_engine_computes(
    serving_cache: Path, kit_of: Callable[[str], AdapterKit], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixture's embedding router runs its encoder on the engine's own thread, not on the
    request's: one thread in the process runs torch's parallel kernels (`mint.trainer.compute_lane`)."""
    threads: set[str] = set()
    encode_batch = SentenceEncoder._encode_batch

    def recorded(encoder: SentenceEncoder, texts: list[str]) -> Any:
        threads.add(threading.current_thread().name)
        return encode_batch(encoder, texts)

    monkeypatch.setattr(SentenceEncoder, "_encode_batch", recorded)
    kit = kit_of("tiny-glm-moe")
    store = LocalObjectStore(tmp_path / "objects")
    versions = {
        version.ref: version
        for version in (
            store_version(store, kit["alpha"].folder, "billing"),
            store_version(store, kit["beta"].folder, "shipping"),
        )
    }
    policy = {
        "type": "embedding",
        "candidates": [
            {"adapter": "billing@1", "examples": ["I was charged twice this month", "Can I get a refund?"]},
            {"adapter": "shipping@1", "examples": ["Where is my package?", "My parcel has not arrived yet"]},
        ],
    }
    mixture = NodeMixture(revision_id="r1", spec={"adapters": list(versions), "policy": policy}, versions=versions)
    spec = get_base_model_spec("tiny-glm-moe", CONFIGS)
    engine = TorchEngine.from_spec(spec, serving_cache, max_adapters=2, max_batch_size=2, own_thread=True)
    node = ServingNode(spec, engine, store, ssd_dir=tmp_path / "ssd")
    try:
        request = NodeCompletion(
            messages=[{"role": "user", "content": "Why was my card charged two times?"}], mixture=mixture, max_tokens=1
        )
        routed, decision = node.route(request)
    finally:
        node.close()
        engine.close()
    assert decision is not None and decision.adapter == "billing@1"
    assert routed.adapter == versions["billing@1"] and routed.mixture is None
    assert threads == {"torch-engine"}
