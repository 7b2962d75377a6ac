"""The Mixture-of-LoRA router: which adapter of a mixture deployment serves each chat request.

A mixture deployment's spec (`MixtureSpec`, in `mint.serving.mixture`, with its policies) names
its adapter versions and one routing policy, a closed set named by `policy.type`:

- `embedding`: each candidate adapter is described by a few example utterances and/or a
  description; their MiniLM embeddings are averaged into one centroid per adapter, and a
  request goes to the centroid nearest (by cosine) to its last user message. Below
  `min_similarity` it falls back to `default`.
- `rules`: ordered rules on the last user message (a regular expression, whole-word
  keywords) and on the request's metadata (e.g. `{"task": "billing"}`); every condition a
  rule states must hold, the first rule that matches wins, else `default`.
- `router_adapter`: a router model (a base or an adapter) reads the last user message and a
  list of candidate labels and names one; an answer that names no candidate, or several,
  goes to `default`.
- `vote`: several adapters answer the same short-answer request; the answer most of them
  give (compared after case, punctuation and whitespace normalisation) wins, ties going to
  the answer of the voter that comes first in `tie_break`. The decision carries the winning
  answer and every voter's answer, so the serving layer returns it without generating again.

Generation is the engine's job: `router_adapter` and `vote` call a `GenerateFn` that the
serving layer provides, which answers one conversation with several adapters (one engine
batch).

Tool-call continuations stay on the adapter that made the call. A client sends only
messages, so the router recognises a continuation by its last assistant message: when that
message made tool calls and only tool results follow it, the request goes to
1. the adapter named by the message's `mint_adapter` field, which Mint's responses carry;
2. else the adapter recorded for that message's fingerprint (a hash of its content and its
   calls, ids included) when the serving layer returned it (`remember_tool_call`);
3. else the policy, as for any request.
The fingerprints live in a bounded, thread-safe LRU map (`ToolCallMemory`), which may be
shared by the routers of successive revisions of a deployment. A remembered adapter that the
current revision no longer names is ignored.

Every decision is a `RouteDecision` naming the adapter that serves the request and why, so a
response can say which adapter version served it. `Router.adapter_refs` lists every model
reference a router may use (the router model included), for the adapter cache to prefetch.
torch is imported only when an embedding policy first embeds text.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from mint.chat.messages import message_text, tool_calls_of
from mint.chat.patterns import Pattern, compile_keywords, compile_pattern
from mint.chat.text import normalize_text
from mint.errors import InvalidRequest
from mint.serving.mixture import (
    EmbeddingPolicy,
    MixtureSpec,
    PolicyType,
    RouterAdapterPolicy,
    RouterCandidate,
    Rule,
    RulesPolicy,
    VotePolicy,
)

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from mint.serving.embeddings import TextEncoder

Message = Mapping[str, Any]
DecidedBy = Literal["hint", "tool_call", "embedding", "rule", "router_adapter", "vote", "default"]

ADAPTER_HINT_FIELD = "mint_adapter"
DEFAULT_MEMORY_ENTRIES = 100_000
# Rules and the router model read at most this much of the last user message.
MAX_MATCH_CHARS = 20_000


class GenerateFn(Protocol):
    """Each of `adapters` answers the same `messages`; one reply text per adapter, in order.

    Provided by the serving layer, which runs them as one engine batch (greedy decoding, so a
    vote is reproducible).
    """

    def __call__(self, adapters: Sequence[str], messages: Sequence[Message], *, max_tokens: int) -> list[str]: ...


# ---- decisions ---------------------------------------------------------------------------------


class RouteDecision(BaseModel):
    """Which adapter serves a request, and why.

    `decided_by` is what chose it: `hint` (the calling message's `mint_adapter`), `tool_call`
    (the remembered caller of a tool), the policy's own method (`embedding`, `rule`,
    `router_adapter`, `vote`), or `default` (the policy's fallback). The other fields are set
    where they apply.
    """

    model_config = ConfigDict(frozen=True)

    adapter: str = Field(description="The model reference that serves the request.")
    policy: PolicyType
    decided_by: DecidedBy
    detail: str = Field(description="The reason, for people.")
    similarity: float | None = Field(default=None, description="embedding: the chosen centroid's cosine similarity.")
    similarities: dict[str, float] = Field(default_factory=dict, description="embedding: every candidate's.")
    rule: int | None = Field(default=None, description="rules: the index of the rule that matched.")
    rule_name: str | None = None
    router_output: str | None = Field(default=None, description="router_adapter: what the router model said.")
    answer: str | None = Field(default=None, description="vote: the winning answer, as its voter wrote it.")
    answers: dict[str, str] = Field(default_factory=dict, description="vote: every voter's answer.")
    votes: int | None = Field(default=None, description="vote: how many voters gave the winning answer.")


# ---- tool-call stickiness ----------------------------------------------------------------------


class ToolCallMemory:
    """Which adapter made each tool call: fingerprint -> adapter, the least recently used dropped first.

    Bounded to `max_entries` (about 170 bytes each: 17 MB for the default 100,000); thread-safe.
    """

    def __init__(self, max_entries: int = DEFAULT_MEMORY_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, str] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, fingerprint: bytes, adapter: str) -> None:
        with self._lock:
            self._entries[fingerprint] = adapter
            self._entries.move_to_end(fingerprint)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def recall(self, fingerprint: bytes) -> str | None:
        with self._lock:
            adapter = self._entries.get(fingerprint)
            if adapter is not None:
                self._entries.move_to_end(fingerprint)
            return adapter

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def tool_call_fingerprint(message: Message) -> bytes:
    """A digest of an assistant message's text and its tool calls (ids, names, arguments).

    Arguments are compared decoded, so a client that re-serialises the JSON string of the
    arguments differently still matches.
    """
    calls = [[call.id, call.name, call.arguments] for call in tool_calls_of(message)]
    payload = json.dumps(
        {"content": message_text(message), "calls": calls}, sort_keys=True, ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).digest()


def continued_tool_call(messages: Sequence[Message]) -> Message | None:
    """The assistant message whose tool calls `messages` continues, or None.

    That is the last assistant message, when it made at least one tool call and every
    message after it (at least one) is a tool result. A new user turn is routed afresh.
    """
    index = len(messages) - 1
    while index >= 0 and messages[index].get("role") == "tool":
        index -= 1
    if index == len(messages) - 1 or index < 0:
        return None
    message = messages[index]
    if message.get("role") != "assistant" or not tool_calls_of(message):
        return None
    return message


def last_user_text(messages: Sequence[Message]) -> str:
    """The text of the last user message; "" when there is none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message)
    return ""


# ---- policies ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    messages: Sequence[Message]
    metadata: Mapping[str, str]
    text: str  # the last user message


class _PolicyRoute(Protocol):
    def __call__(self, request: _Request) -> RouteDecision: ...


class _EmbeddingRoute:
    def __init__(self, policy: EmbeddingPolicy, encoder: TextEncoder) -> None:
        import numpy as np

        self.policy = policy
        self.encoder = encoder
        self.adapters = [candidate.adapter for candidate in policy.candidates]
        texts: list[str] = []
        owners: list[int] = []
        for index, candidate in enumerate(policy.candidates):
            described = [*candidate.examples, *([candidate.description] if candidate.description else [])]
            texts += described
            owners += [index] * len(described)
        vectors_N_D = encoder.encode(texts)
        owners_N = np.asarray(owners)
        # The mean of unit vectors, renormalised: a direction, so that a dot product is a cosine.
        centroids_A_D = np.stack([vectors_N_D[owners_N == index].mean(axis=0) for index in range(len(self.adapters))])
        norms_A_1 = np.linalg.norm(centroids_A_D, axis=1, keepdims=True)
        self.centroids_A_D: NDArray[np.float32] = (centroids_A_D / np.maximum(norms_A_1, 1e-12)).astype(np.float32)

    def __call__(self, request: _Request) -> RouteDecision:
        policy = self.policy
        if not request.text.strip():
            adapter = policy.default or self.adapters[0]
            return RouteDecision(
                adapter=adapter, policy="embedding", decided_by="default", detail="no user message to embed"
            )
        query_D = self.encoder.encode([request.text[:MAX_MATCH_CHARS]])[0]
        similarities_A = self.centroids_A_D @ query_D
        best = int(similarities_A.argmax())
        similarity = float(similarities_A[best])
        similarities = {adapter: float(value) for adapter, value in zip(self.adapters, similarities_A, strict=True)}
        if policy.min_similarity is not None and similarity < policy.min_similarity:
            assert policy.default is not None  # the spec requires it with min_similarity
            return RouteDecision(
                adapter=policy.default,
                policy="embedding",
                decided_by="default",
                detail=f"nearest was {self.adapters[best]} at {similarity:.3f}, below min_similarity "
                f"{policy.min_similarity}",
                similarity=similarity,
                similarities=similarities,
            )
        return RouteDecision(
            adapter=self.adapters[best],
            policy="embedding",
            decided_by="embedding",
            detail=f"nearest centroid, cosine similarity {similarity:.3f}",
            similarity=similarity,
            similarities=similarities,
        )


@dataclass(frozen=True)
class _CompiledRule:
    rule: Rule
    pattern: Pattern | None
    keywords: Pattern | None

    @classmethod
    def of(cls, rule: Rule) -> _CompiledRule:
        flags = re.IGNORECASE if rule.ignore_case else 0
        pattern = compile_pattern(rule.pattern, flags) if rule.pattern is not None else None
        # Whole words: no word character on either side (works for "c++" and "e-mail" too).
        keywords = compile_keywords(rule.keywords, rule.ignore_case) if rule.keywords is not None else None
        return cls(rule, pattern, keywords)

    def matches(self, request: _Request) -> bool:
        text = request.text[:MAX_MATCH_CHARS]
        if self.rule.metadata is not None and any(
            request.metadata.get(key) != value for key, value in self.rule.metadata.items()
        ):
            return False
        if self.pattern is not None and self.pattern.search(text) is None:
            return False
        return self.keywords is None or self.keywords.search(text) is not None


class _RulesRoute:
    def __init__(self, policy: RulesPolicy) -> None:
        self.policy = policy
        self.rules = [_CompiledRule.of(rule) for rule in policy.rules]

    def __call__(self, request: _Request) -> RouteDecision:
        for index, compiled in enumerate(self.rules):
            if compiled.matches(request):
                label = f"rule {index}" + (f" ({compiled.rule.name})" if compiled.rule.name else "")
                return RouteDecision(
                    adapter=compiled.rule.adapter,
                    policy="rules",
                    decided_by="rule",
                    detail=f"{label} matched",
                    rule=index,
                    rule_name=compiled.rule.name,
                )
        return RouteDecision(
            adapter=self.policy.default, policy="rules", decided_by="default", detail="no rule matched"
        )


DEFAULT_ROUTER_INSTRUCTIONS = (
    "You route each user message to the assistant best suited to answer it. "
    "Reply with the name of exactly one assistant and nothing else.\n"
    "Assistants:\n{candidates}"
)


def parse_router_choice(output: str, candidates: Sequence[RouterCandidate]) -> str | None:
    """The adapter a router model's `output` names, or None if it names none or several.

    Compared after case, punctuation and whitespace normalisation: the whole output equal to
    a label (or an adapter reference) wins; else the one candidate whose label occurs in the
    output as whole words, if exactly one does.
    """
    said = normalize_text(output[:MAX_MATCH_CHARS])
    if not said:
        return None
    names = [
        (candidate.adapter, normalize_text(name))
        for candidate in candidates
        for name in (candidate.resolved_label, candidate.adapter)
    ]
    for adapter, name in names:
        if said == name:
            return adapter
    named = {adapter for adapter, name in names if name and f" {name} " in f" {said} "}
    return named.pop() if len(named) == 1 else None


class _RouterAdapterRoute:
    def __init__(self, policy: RouterAdapterPolicy, candidates: list[RouterCandidate], generate: GenerateFn) -> None:
        self.policy = policy
        self.candidates = candidates
        self.generate = generate
        listing = "\n".join(
            f"- {candidate.resolved_label}" + (f": {candidate.description}" if candidate.description else "")
            for candidate in candidates
        )
        self.system = (policy.instructions or DEFAULT_ROUTER_INSTRUCTIONS).replace("{candidates}", listing)

    def __call__(self, request: _Request) -> RouteDecision:
        policy = self.policy
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": request.text[:MAX_MATCH_CHARS]},
        ]
        [output] = self.generate([policy.router], messages, max_tokens=policy.max_tokens)
        adapter = parse_router_choice(output, self.candidates)
        if adapter is None:
            return RouteDecision(
                adapter=policy.default,
                policy="router_adapter",
                decided_by="default",
                detail=f"the router's answer {output[:80]!r} names no single candidate",
                router_output=output,
            )
        return RouteDecision(
            adapter=adapter,
            policy="router_adapter",
            decided_by="router_adapter",
            detail=f"{policy.router} chose it",
            router_output=output,
        )


class _VoteRoute:
    def __init__(self, policy: VotePolicy, voters: list[str], generate: GenerateFn) -> None:
        self.policy = policy
        self.voters = voters
        self.order = list(policy.tie_break or voters)
        self.generate = generate

    def __call__(self, request: _Request) -> RouteDecision:
        replies = self.generate(self.voters, request.messages, max_tokens=self.policy.max_tokens)
        if len(replies) != len(self.voters):
            raise RuntimeError(f"generate returned {len(replies)} answers for {len(self.voters)} voters")
        answers = dict(zip(self.voters, replies, strict=True))
        normalized = {
            voter: normalize_text(answers[voter], remove_articles=self.policy.remove_articles) for voter in self.order
        }
        # Empty answers abstain. Counter keeps first-insertion order, and voters are inserted in
        # tie-break order, so among equal counts the first is the answer of the most trusted voter.
        counts = Counter(answer for answer in normalized.values() if answer)
        if not counts:
            first = self.order[0]
            return RouteDecision(
                adapter=first,
                policy="vote",
                decided_by="vote",
                detail="every voter's answer was empty",
                answer=answers[first],
                answers=answers,
                votes=0,
            )
        winner, votes = max(counts.items(), key=lambda item: item[1])  # max keeps the first of equal counts
        adapter = next(voter for voter in self.order if normalized[voter] == winner)
        tied = sum(1 for count in counts.values() if count == votes) > 1
        return RouteDecision(
            adapter=adapter,
            policy="vote",
            decided_by="vote",
            detail=f"{votes} of {len(self.voters)} voters agree" + ("; tie broken by tie_break order" if tied else ""),
            answer=answers[adapter],
            answers=answers,
            votes=votes,
        )


# ---- the router --------------------------------------------------------------------------------


class Router:
    """Routes the chat requests of one mixture deployment revision; thread-safe.

    `encoder` embeds text for an embedding policy (default: the process's MiniLM, loaded
    here, so candidates' centroids are ready before the first request); `generate` runs
    models for the router_adapter and vote policies, which need it. `memory` records which
    adapter made each tool call; pass one to share it between revisions.
    """

    def __init__(
        self,
        spec: MixtureSpec | Mapping[str, Any],
        *,
        encoder: TextEncoder | None = None,
        generate: GenerateFn | None = None,
        memory: ToolCallMemory | None = None,
    ) -> None:
        self.spec = spec if isinstance(spec, MixtureSpec) else MixtureSpec.model_validate(spec)
        self.memory = memory if memory is not None else ToolCallMemory()
        self._route = self._build(encoder, generate)

    def _build(self, encoder: TextEncoder | None, generate: GenerateFn | None) -> _PolicyRoute:
        policy = self.spec.policy
        if isinstance(policy, EmbeddingPolicy):
            if encoder is None:
                from mint.serving.embeddings import get_encoder

                encoder = get_encoder()
            return _EmbeddingRoute(policy, encoder)
        if isinstance(policy, RulesPolicy):
            return _RulesRoute(policy)
        if generate is None:
            # Mint's wiring, not the request, is wrong here.
            raise ValueError(f"a {policy.type} policy runs models: give the Router a generate function")
        if isinstance(policy, RouterAdapterPolicy):
            return _RouterAdapterRoute(policy, self.spec.router_candidates, generate)
        return _VoteRoute(policy, self.spec.voters, generate)

    @property
    def policy(self) -> PolicyType:
        return self.spec.policy.type

    @property
    def candidates(self) -> tuple[str, ...]:
        """The adapters that may serve a request, in the spec's order."""
        return tuple(self.spec.adapters)

    @property
    def adapter_refs(self) -> frozenset[str]:
        """Every model reference this router may use, the router model included: what to prefetch."""
        router = self.spec.policy.router if isinstance(self.spec.policy, RouterAdapterPolicy) else None
        return frozenset(self.spec.adapters) | ({router} if router is not None else frozenset())

    def route(self, messages: Sequence[Message], *, metadata: Mapping[str, str] | None = None) -> RouteDecision:
        """The adapter that serves this chat request: a tool-call continuation's caller, else the policy's choice."""
        if not messages:
            raise InvalidRequest("messages must not be empty", param="messages")
        sticky = self._sticky(messages)
        if sticky is not None:
            return sticky
        request = _Request(messages=messages, metadata=metadata or {}, text=last_user_text(messages))
        return self._route(request)

    def _sticky(self, messages: Sequence[Message]) -> RouteDecision | None:
        caller = continued_tool_call(messages)
        if caller is None:
            return None
        hint = caller.get(ADAPTER_HINT_FIELD)
        if isinstance(hint, str) and hint in self.spec.adapters:
            return RouteDecision(
                adapter=hint,
                policy=self.policy,
                decided_by="hint",
                detail=f"continues a tool call the message marks as made by {hint}",
            )
        remembered = self.memory.recall(tool_call_fingerprint(caller))
        if remembered is not None and remembered in self.spec.adapters:
            return RouteDecision(
                adapter=remembered,
                policy=self.policy,
                decided_by="tool_call",
                detail=f"continues a tool call made by {remembered}",
            )
        return None

    def remember_tool_call(self, messages_with_reply: Sequence[Message], adapter: str) -> bool:
        """Record that `adapter` wrote the last message (the reply), if it makes tool calls.

        The serving layer calls this when it returns a reply; True when it was recorded.
        """
        if adapter not in self.spec.adapters:
            raise InvalidRequest(
                f"{adapter!r} is not one of this mixture's adapters ({', '.join(self.spec.adapters)})", param="adapter"
            )
        if not messages_with_reply:
            return False
        reply = messages_with_reply[-1]
        if reply.get("role") != "assistant" or not tool_calls_of(reply):
            return False
        self.memory.remember(tool_call_fingerprint(reply), adapter)
        return True
