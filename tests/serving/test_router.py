"""The Mixture-of-LoRA router: the spec's validation, each policy, and tool-call stickiness.

Embedding routing runs the real MiniLM model (loaded once per test process). The
router_adapter and vote policies need a model to answer; generation is the engine's job,
covered by the engine contract tests, so here deterministic functions stand in for it and
the tests check what the router does with the answers: how it prompts, parses, counts and
breaks ties.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mint.errors import InvalidRequest
from mint.serving.embeddings import SentenceEncoder, get_encoder
from mint.serving.mixture import MixtureSpec
from mint.serving.router import (
    ADAPTER_HINT_FIELD,
    Router,
    ToolCallMemory,
    continued_tool_call,
    parse_router_choice,
    tool_call_fingerprint,
)
from tests.conftest import REDOS_PATTERNS

pytestmark = pytest.mark.backend_free

BILLING, SHIPPING, CODE = "billing@3", "shipping@1", "code@7"
ADAPTERS = [BILLING, SHIPPING, CODE]

EMBEDDING_POLICY: dict[str, Any] = {
    "type": "embedding",
    "candidates": [
        {
            "adapter": BILLING,
            "description": "Questions about invoices, charges, refunds and payment methods.",
            "examples": [
                "I was charged twice this month",
                "How do I get a refund for my subscription?",
                "Can I pay my invoice by credit card?",
            ],
        },
        {
            "adapter": SHIPPING,
            "examples": [
                "Where is my package?",
                "My parcel has not arrived yet",
                "How long does delivery take to Canada?",
            ],
        },
        {
            "adapter": CODE,
            "examples": [
                "Why does my Python function raise a KeyError?",
                "How do I reverse a list in JavaScript?",
                "Fix this SQL query that returns duplicate rows",
            ],
        },
    ],
}

RULES_POLICY: dict[str, Any] = {
    "type": "rules",
    "rules": [
        {"name": "tagged code", "metadata": {"task": "code"}, "adapter": CODE},
        {"name": "money", "keywords": ["refund", "invoice", "charged"], "adapter": BILLING},
        {"name": "tracking", "pattern": r"\btrack(ing)?\b", "adapter": SHIPPING},
        {"name": "money again", "keywords": ["tracking"], "adapter": BILLING},
    ],
    "default": CODE,
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool_call_reply(call_id: str = "call_1") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
        ],
    }


def tool_result(call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": '{"status": "shipped"}'}


class Replies:
    """Stands in for the engine: each adapter gives a fixed reply; every call is kept."""

    def __init__(self, replies: Mapping[str, str]) -> None:
        self.replies = replies
        self.calls: list[tuple[list[str], list[Mapping[str, Any]], int]] = []

    def __call__(self, adapters: Sequence[str], messages: Sequence[Mapping[str, Any]], *, max_tokens: int) -> list[str]:
        self.calls.append((list(adapters), list(messages), max_tokens))
        return [self.replies[adapter] for adapter in adapters]


@pytest.fixture(scope="module")
def encoder() -> SentenceEncoder:
    """The process's MiniLM encoder, loaded once for the module."""
    loaded = get_encoder()
    loaded.load()
    return loaded


@pytest.fixture(scope="module")
def embedding_router(encoder: SentenceEncoder) -> Router:
    """Billing, shipping and code adapters, each described by a few utterances; centroids embedded once."""
    return Router({"adapters": ADAPTERS, "policy": EMBEDDING_POLICY}, encoder=encoder)


# ---- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("routing", "param", "words"),
    [
        ({"adapters": ADAPTERS, "policy": {"type": "magic"}}, "policy.type", "one of: embedding"),
        ({"adapters": ADAPTERS, "policy": {**RULES_POLICY, "default": "other@1"}}, "policy.default", "not one of"),
        ({"adapters": ADAPTERS, "policy": {"type": "rules", "rules": RULES_POLICY["rules"]}}, "policy.default", ""),
        (
            {"adapters": ADAPTERS, "policy": {"type": "rules", "rules": [{"adapter": CODE}], "default": CODE}},
            "policy.rules.0",
            "at least one condition",
        ),
        (
            {"adapters": ADAPTERS, "policy": {**RULES_POLICY, "rules": [{"pattern": "(a)\\1", "adapter": CODE}]}},
            "policy.rules.0",
            "backreferences",
        ),
        (
            {"adapters": ADAPTERS, "policy": {**RULES_POLICY, "rules": [{"pattern": "a(?!b)", "adapter": CODE}]}},
            "policy.rules.0",
            "lookarounds",
        ),
        ({"adapters": ADAPTERS, "policy": {**EMBEDDING_POLICY, "min_similarity": 0.5}}, "policy", "default"),
        ({"adapters": [BILLING, BILLING], "policy": RULES_POLICY}, "adapters", "repeated"),
        ({"adapters": ADAPTERS, "policy": {"type": "vote", "voters": [BILLING]}}, "policy.voters", "at least 2"),
        (
            {"adapters": ADAPTERS, "policy": {"type": "vote", "tie_break": [BILLING, SHIPPING]}},
            "policy.tie_break",
            "every voter",
        ),
        (
            {
                "adapters": ["billing@3", "billing@4"],
                "policy": {"type": "router_adapter", "router": "r@1", "default": BILLING},
            },
            "policy.candidates",
            "label",
        ),
        ({"adapters": ADAPTERS, "policy": {**RULES_POLICY, "colour": "red"}}, "policy.colour", "not an option"),
    ],
)
def test_bad_specs_name_the_field(routing: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        MixtureSpec.model_validate(routing)
    assert caught.value.param == param
    assert words in caught.value.message


def test_router_needs_generate_for_policies_that_run_models() -> None:
    with pytest.raises(ValueError, match="generate"):
        Router({"adapters": ADAPTERS, "policy": {"type": "vote"}})


def test_adapter_refs_for_prefetch_include_the_router_model() -> None:
    spec = {"adapters": ADAPTERS, "policy": {"type": "router_adapter", "router": "router@2", "default": CODE}}
    router = Router(spec, generate=Replies({}))
    assert router.candidates == (BILLING, SHIPPING, CODE)
    assert router.adapter_refs == frozenset({*ADAPTERS, "router@2"})


def test_importing_the_router_does_not_import_torch() -> None:
    code = "import sys, mint.serving.router, mint.serving.embeddings; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_api_side_of_mixtures_imports_no_torch() -> None:
    """The spec and the request that carries it are what the API process imports: no torch, no transformers."""
    modules = (
        "mint.serving.mixture, mint.schemas.node, mint.services.serving.inference, mint.services.serving.deployments"
    )
    code = f"import sys, {modules}, mint.api.openai; assert not {{'torch', 'transformers'}} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- embedding -----------------------------------------------------------------------------------


@pytest.mark.torch
def test_embeddings_are_unit_vectors_in_input_order(encoder: SentenceEncoder) -> None:
    texts = ["a parcel", "an invoice that is much longer than the first text", "a parcel"]
    vectors = encoder.encode(texts)
    assert vectors.shape == (3, 384)
    assert abs(float((vectors * vectors).sum(axis=1).min()) - 1.0) < 1e-5
    assert float(vectors[0] @ vectors[2]) > 0.9999
    assert float(vectors[0] @ vectors[1]) < 0.9
    # Concurrent callers get what one caller gets.
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: encoder.encode(texts), range(4)))
    assert all(abs(result - vectors).max() < 1e-5 for result in results)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("query", "adapter"),
    [
        ("There is an extra charge on my bill that I don't recognise", BILLING),
        ("I want my money back", BILLING),
        ("The courier says my order was delivered but I never got it", SHIPPING),
        ("When will my shipment arrive?", SHIPPING),
        ("My React component renders twice, what is wrong with this code?", CODE),
        ("TypeError: 'NoneType' object is not subscriptable", CODE),
    ],
)
def test_embedding_routes_to_the_nearest_centroid(embedding_router: Router, query: str, adapter: str) -> None:
    decision = embedding_router.route([user(query)])
    assert decision.adapter == adapter, decision.similarities
    assert decision.decided_by == "embedding"
    assert decision.similarity == max(decision.similarities.values())
    assert set(decision.similarities) == set(ADAPTERS)


@pytest.mark.torch
def test_embedding_falls_back_below_min_similarity(encoder: SentenceEncoder) -> None:
    policy = {**EMBEDDING_POLICY, "min_similarity": 0.3, "default": CODE}
    policy["candidates"] = policy["candidates"][:2]  # billing and shipping only
    router = Router({"adapters": ADAPTERS, "policy": policy}, encoder=encoder)

    near = router.route([user("Please refund the double charge on my invoice")])
    assert (near.adapter, near.decided_by) == (BILLING, "embedding")
    assert near.similarity is not None and near.similarity >= 0.3

    far = router.route([user("Write a haiku about autumn leaves")])
    assert (far.adapter, far.decided_by) == (CODE, "default")
    assert far.similarity is not None and far.similarity < 0.3
    assert "below min_similarity" in far.detail

    silent = router.route([{"role": "system", "content": "You are helpful."}])
    assert (silent.adapter, silent.decided_by) == (CODE, "default")


# ---- rules ---------------------------------------------------------------------------------------


def test_rules_first_match_wins_then_default() -> None:
    router = Router({"adapters": ADAPTERS, "policy": RULES_POLICY})

    tagged = router.route([user("I need a refund")], metadata={"task": "code"})
    assert (tagged.adapter, tagged.rule, tagged.rule_name) == (CODE, 0, "tagged code")

    money = router.route([user("Where is my REFUND?")], metadata={"task": "other"})
    assert (money.adapter, money.decided_by, money.rule) == (BILLING, "rule", 1)

    # Rule 3 would match "tracking" too, but rule 2 comes first.
    tracking = router.route([user("What is the tracking number?")])
    assert (tracking.adapter, tracking.rule) == (SHIPPING, 2)

    # Keywords are whole words: "invoices" is not "invoice"; the last user message is the one read.
    fallthrough = router.route([user("an invoice"), {"role": "assistant", "content": "ok"}, user("my invoices")])
    assert (fallthrough.adapter, fallthrough.decided_by, fallthrough.rule) == (CODE, "default", None)


def test_rule_conditions_must_all_hold() -> None:
    policy = {
        "type": "rules",
        "rules": [{"keywords": ["C++"], "metadata": {"task": "code"}, "ignore_case": False, "adapter": CODE}],
        "default": BILLING,
    }
    router = Router({"adapters": ADAPTERS, "policy": policy})
    assert router.route([user("a C++ question")], metadata={"task": "code"}).adapter == CODE
    assert router.route([user("a c++ question")], metadata={"task": "code"}).adapter == BILLING
    assert router.route([user("a C++ question")]).adapter == BILLING


@pytest.mark.parametrize(("pattern", "text"), REDOS_PATTERNS)
def test_rule_patterns_run_in_linear_time(pattern: str, text: str) -> None:
    policy = {"type": "rules", "rules": [{"pattern": pattern, "adapter": CODE}], "default": BILLING}
    router = Router({"adapters": ADAPTERS, "policy": policy})
    assert router.route([user(text)]).adapter == BILLING


def test_keywords_are_whole_words_in_any_script() -> None:
    policy = {"type": "rules", "rules": [{"keywords": ["café", "e-mail"], "adapter": CODE}], "default": BILLING}
    router = Router({"adapters": ADAPTERS, "policy": policy})
    assert router.route([user("un CAFÉ noir")]).adapter == CODE
    assert router.route([user("send an e-mail.")]).adapter == CODE
    assert router.route([user("cafés")]).adapter == BILLING
    assert router.route([user("xe-mail")]).adapter == BILLING
    assert router.route([user("a" * 20_000)]).adapter == BILLING


# ---- router adapter ------------------------------------------------------------------------------

ROUTER_POLICY: dict[str, Any] = {
    "type": "router_adapter",
    "router": "router@2",
    "candidates": [
        {"adapter": BILLING, "description": "invoices and refunds"},
        {"adapter": SHIPPING, "label": "delivery"},
        {"adapter": CODE},
    ],
    "default": CODE,
}


@pytest.mark.parametrize(
    ("said", "adapter", "decided_by"),
    [
        ("billing", BILLING, "router_adapter"),
        ("  Delivery. ", SHIPPING, "router_adapter"),
        ("shipping@1", SHIPPING, "router_adapter"),
        ("The best assistant is billing.", BILLING, "router_adapter"),
        ("billing or delivery", CODE, "default"),
        ("weather", CODE, "default"),
        ("", CODE, "default"),
    ],
)
def test_router_adapter_answers_are_parsed_against_the_candidates(said: str, adapter: str, decided_by: str) -> None:
    generate = Replies({"router@2": said})
    router = Router({"adapters": ADAPTERS, "policy": ROUTER_POLICY}, generate=generate)
    decision = router.route([user("Where is my parcel?")])
    assert (decision.adapter, decision.decided_by, decision.router_output) == (adapter, decided_by, said)

    [(adapters, messages, max_tokens)] = generate.calls
    assert adapters == ["router@2"] and max_tokens == 16
    assert messages[-1] == user("Where is my parcel?")
    assert "- billing: invoices and refunds\n- delivery\n- code" in messages[0]["content"]


def test_parse_router_choice_defaults_labels_to_adapter_names() -> None:
    spec = MixtureSpec.model_validate({"adapters": ADAPTERS, "policy": {**ROUTER_POLICY, "candidates": None}})
    assert parse_router_choice("Shipping!", spec.router_candidates) == SHIPPING
    assert parse_router_choice("code, code", spec.router_candidates) == CODE
    assert parse_router_choice("billingual", spec.router_candidates) is None


# ---- vote ----------------------------------------------------------------------------------------


def test_vote_majority_by_normalized_answer() -> None:
    generate = Replies({BILLING: "Paris.", SHIPPING: "  paris", CODE: "Lyon"})
    router = Router({"adapters": ADAPTERS, "policy": {"type": "vote", "max_tokens": 8}}, generate=generate)
    messages = [user("Capital of France? One word.")]
    decision = router.route(messages)
    assert (decision.adapter, decision.answer, decision.votes) == (BILLING, "Paris.", 2)
    assert decision.answers == {BILLING: "Paris.", SHIPPING: "  paris", CODE: "Lyon"}
    assert generate.calls == [(ADAPTERS, messages, 8)]


def test_vote_ties_go_to_the_first_voter_in_tie_break_order() -> None:
    generate = Replies({BILLING: "4", SHIPPING: "5", CODE: ""})  # the empty answer abstains
    policy = {"type": "vote", "tie_break": [SHIPPING, CODE, BILLING]}
    decision = Router({"adapters": ADAPTERS, "policy": policy}, generate=generate).route([user("2 + 2?")])
    assert (decision.adapter, decision.answer, decision.votes) == (SHIPPING, "5", 1)
    assert "tie" in decision.detail

    in_order = Router({"adapters": ADAPTERS, "policy": {"type": "vote"}}, generate=generate).route([user("2 + 2?")])
    assert (in_order.adapter, in_order.answer) == (BILLING, "4")


def test_vote_among_named_voters_only() -> None:
    generate = Replies({SHIPPING: "no", CODE: "yes"})
    policy = {"type": "vote", "voters": [CODE, SHIPPING]}
    decision = Router({"adapters": ADAPTERS, "policy": policy}, generate=generate).route([user("ok?")])
    assert (decision.adapter, decision.answer) == (CODE, "yes")
    assert list(decision.answers) == [CODE, SHIPPING]


# ---- tool-call stickiness ------------------------------------------------------------------------


def test_a_tool_call_continuation_stays_on_the_adapter_that_made_the_call() -> None:
    router = Router({"adapters": ADAPTERS, "policy": RULES_POLICY})
    question = [user("Was I charged for order A1? Look it up.")]
    assert router.route(question).adapter == BILLING  # the policy's choice

    # Suppose the serving layer sent it to the code adapter, which called a tool.
    with_reply = [*question, tool_call_reply()]
    assert router.remember_tool_call(with_reply, CODE) is True

    # The client sends back the call, re-serialising the arguments, and the tool's result.
    echoed = {**tool_call_reply(), "tool_calls": [{**tool_call_reply()["tool_calls"][0]}]}
    echoed["tool_calls"][0]["function"] = {"name": "lookup_order", "arguments": '{ "order_id":"A1" }'}
    continued = router.route([*question, echoed, tool_result()])
    assert (continued.adapter, continued.decided_by, continued.policy) == (CODE, "tool_call", "rules")

    # Another call (another id) is not the remembered one; a new user turn is routed afresh.
    assert router.route([*question, tool_call_reply("call_2"), tool_result("call_2")]).adapter == BILLING
    assert router.route([*question, echoed, tool_result(), user("Refund it")]).adapter == BILLING


def test_the_mint_adapter_field_routes_a_continuation() -> None:
    router = Router({"adapters": ADAPTERS, "policy": RULES_POLICY})
    question = [user("Was I charged twice?")]
    marked = {**tool_call_reply(), ADAPTER_HINT_FIELD: SHIPPING}
    decision = router.route([*question, marked, tool_result()])
    assert (decision.adapter, decision.decided_by) == (SHIPPING, "hint")
    # An adapter this mixture does not serve is ignored.
    stale = {**tool_call_reply(), ADAPTER_HINT_FIELD: "shipping@0"}
    assert router.route([*question, stale, tool_result()]).adapter == BILLING


def test_text_form_tool_calls_are_remembered_too() -> None:
    router = Router({"adapters": ADAPTERS, "policy": RULES_POLICY})
    reply = {"role": "assistant", "content": '{"name": "lookup_order", "arguments": {"order_id": "A1"}}'}
    question = [user("invoice for A1?")]
    assert router.remember_tool_call([*question, reply], SHIPPING)
    assert router.route([*question, reply, tool_result()]).adapter == SHIPPING
    # A reply without calls is not remembered; nor is an adapter outside the mixture accepted.
    assert router.remember_tool_call([*question, {"role": "assistant", "content": "Hi"}], SHIPPING) is False
    with pytest.raises(InvalidRequest):
        router.remember_tool_call([*question, reply], "other@1")


def test_continued_tool_call_needs_tool_results_after_the_call() -> None:
    call = tool_call_reply()
    assert continued_tool_call([user("q"), call, tool_result()]) is call
    assert continued_tool_call([user("q"), call]) is None
    assert continued_tool_call([user("q"), {"role": "assistant", "content": "no call"}, tool_result()]) is None
    assert continued_tool_call([tool_result()]) is None


def test_tool_call_memory_is_a_bounded_lru() -> None:
    memory = ToolCallMemory(max_entries=3)
    fingerprints = [tool_call_fingerprint(tool_call_reply(f"call_{index}")) for index in range(5)]
    assert len(set(fingerprints)) == 5
    for fingerprint in fingerprints[:3]:
        memory.remember(fingerprint, BILLING)
    assert memory.recall(fingerprints[0]) == BILLING  # now the most recently used
    memory.remember(fingerprints[3], SHIPPING)  # evicts call_1, the least recently used
    assert len(memory) == 3
    assert memory.recall(fingerprints[1]) is None
    assert [memory.recall(fingerprint) for fingerprint in (fingerprints[0], fingerprints[2], fingerprints[3])] == [
        BILLING,
        BILLING,
        SHIPPING,
    ]
    # Shared by a router: its oldest tool call is forgotten first, and the policy takes over.
    router = Router({"adapters": ADAPTERS, "policy": RULES_POLICY}, memory=ToolCallMemory(max_entries=2))
    question = [user("invoice?")]
    for index in range(3):
        router.remember_tool_call([*question, tool_call_reply(f"c{index}")], CODE)
    routed = [router.route([*question, tool_call_reply(f"c{index}"), tool_result(f"c{index}")]) for index in range(3)]
    assert [decision.adapter for decision in routed] == [BILLING, CODE, CODE]
    assert len(router.memory) == 2


def test_tool_call_memory_is_thread_safe() -> None:
    memory = ToolCallMemory(max_entries=1_000)

    def work(worker: int) -> None:
        for index in range(2_000):
            fingerprint = f"{worker}:{index}".encode()
            memory.remember(fingerprint, CODE)
            memory.recall(fingerprint)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(work, range(4)))
    assert len(memory) == 1_000
