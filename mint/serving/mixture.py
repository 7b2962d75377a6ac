"""The mixture wire spec: a mixture deployment's adapters and routing policy, and what a node needs to serve it.

A deployment of kind `mixture` names its adapter versions (model references such as
`billing@3`) and one routing policy, validated once into a `MixtureSpec` (the revision's
`routing` object):

    {"adapters": ["billing@3", "shipping@1", "code@7"],
     "policy": {"type": "rules", "rules": [{"keywords": ["refund", "invoice"], "adapter": "billing@3"}],
                "default": "code@7"}}

Policies, a closed set named by `policy.type`: `embedding` (the nearest candidate's centroid
of example utterances), `rules` (the first matching rule), `router_adapter` (a router model
names the candidate) and `vote` (the answer most adapters give); how each routes is
`mint.serving.router`'s.

This module is what the API, its services and a serving node share: `MixtureSpec` validates a
deployment's `routing` once (any problem is an InvalidRequest naming the field), and
`MixtureTarget` carries a revision's spec with its adapter versions (content hash, object
key) in the request the API forwards to a node. It imports pydantic and Mint's text
helpers only, never torch; the router that runs a spec is `mint.serving.router`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)

from mint.chat.patterns import MAX_PATTERN_CHARS, compile_pattern
from mint.chat.text import normalize_text
from mint.errors import InvalidRequest
from mint.schemas.common import ID_PATTERN
from mint.schemas.node import NodeMixture

ModelRef = Annotated[str, Field(min_length=1, max_length=300, pattern=ID_PATTERN)]
PolicyType = Literal["embedding", "rules", "router_adapter", "vote"]


# ---- the spec ----------------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


Utterance = Annotated[str, Field(min_length=1, max_length=2_000)]


class EmbeddingCandidate(_Spec):
    """An adapter and what the requests it should serve look like."""

    adapter: ModelRef
    examples: list[Utterance] = Field(default_factory=list, max_length=200, description="Typical user messages.")
    description: Utterance | None = Field(default=None, description="What the adapter is for, in a sentence.")

    @model_validator(mode="after")
    def _described(self) -> EmbeddingCandidate:
        if not self.examples and self.description is None:
            raise ValueError("give a candidate some examples, a description, or both")
        return self


class EmbeddingPolicy(_Spec):
    """Route to the candidate whose examples' centroid is nearest to the last user message."""

    type: Literal["embedding"] = "embedding"
    candidates: list[EmbeddingCandidate] = Field(min_length=1, max_length=256)
    min_similarity: float | None = Field(
        default=None, ge=-1.0, le=1.0, description="Below this cosine similarity, use `default`."
    )
    default: ModelRef | None = Field(default=None, description="Serves what no candidate is near enough to.")

    @model_validator(mode="after")
    def _fallback(self) -> EmbeddingPolicy:
        if self.min_similarity is not None and self.default is None:
            raise ValueError("min_similarity needs a default adapter to fall back to; set `default`")
        return self


class Rule(_Spec):
    """Conditions on a request, and the adapter that serves it when they all hold.

    `pattern` is searched for in the last user message; `keywords` match when any of them
    occurs there as a whole word; `metadata` matches when the request's metadata has every
    one of these key-value pairs.
    """

    adapter: ModelRef
    name: str | None = Field(default=None, max_length=200, description="Shown in the route decision.")
    pattern: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN_CHARS)
    keywords: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        default=None, min_length=1, max_length=200
    )
    metadata: dict[str, str] | None = Field(default=None, min_length=1, max_length=50)
    ignore_case: bool = Field(default=True, description="For `pattern` and `keywords`.")

    @model_validator(mode="after")
    def _conditions(self) -> Rule:
        if self.pattern is None and self.keywords is None and self.metadata is None:
            raise ValueError("a rule needs at least one condition: pattern, keywords or metadata")
        if self.pattern is not None:
            compile_pattern(self.pattern, re.IGNORECASE if self.ignore_case else 0)  # ValueError says the fix
        return self


class RulesPolicy(_Spec):
    """The first rule that matches picks the adapter; `default` serves the rest."""

    type: Literal["rules"] = "rules"
    rules: list[Rule] = Field(min_length=1, max_length=1_000)
    default: ModelRef


_LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$"


class RouterCandidate(_Spec):
    """An adapter as the router model knows it: the label it answers with, and what it is for."""

    adapter: ModelRef
    label: str | None = Field(
        default=None, max_length=100, pattern=_LABEL_PATTERN, description="Default: the adapter's name, before '@'."
    )
    description: str | None = Field(default=None, max_length=500)

    @property
    def resolved_label(self) -> str:
        return self.label if self.label is not None else self.adapter.partition("@")[0]


class RouterAdapterPolicy(_Spec):
    """Ask a router model which candidate should serve; an answer naming none of them goes to `default`."""

    type: Literal["router_adapter"] = "router_adapter"
    router: ModelRef = Field(description="The model that routes: a base or an adapter (`router@2`).")
    candidates: list[RouterCandidate] | None = Field(
        default=None, min_length=1, max_length=256, description="Default: every adapter, labelled by its name."
    )
    default: ModelRef
    max_tokens: int = Field(default=16, ge=1, le=256)
    instructions: str | None = Field(
        default=None,
        min_length=1,
        max_length=4_000,
        description="The router's system message; `{candidates}` is replaced by the list of labels. "
        "Default: Mint's own, which the router was trained on if Mint trained it.",
    )


class VotePolicy(_Spec):
    """Several adapters answer; the most common normalised answer wins, ties by `tie_break` order."""

    type: Literal["vote"] = "vote"
    voters: list[ModelRef] | None = Field(
        default=None, min_length=2, max_length=16, description="Default: every adapter."
    )
    tie_break: list[ModelRef] | None = Field(
        default=None, description="Every voter once, most trusted first. Default: the voters' order."
    )
    max_tokens: int = Field(default=32, ge=1, le=1_024, description="Votes are for short answers.")
    remove_articles: bool = Field(default=False, description="Also ignore a / an / the when comparing answers.")


Policy = Annotated[EmbeddingPolicy | RulesPolicy | RouterAdapterPolicy | VotePolicy, Field(discriminator="type")]
_POLICY_MODELS: dict[str, type[BaseModel]] = {
    "embedding": EmbeddingPolicy,
    "rules": RulesPolicy,
    "router_adapter": RouterAdapterPolicy,
    "vote": VotePolicy,
}
POLICY_TYPES: tuple[PolicyType, ...] = ("embedding", "rules", "router_adapter", "vote")


class MixtureSpec(_Spec):
    """A mixture deployment's adapters and routing policy; any problem raises InvalidRequest naming the field."""

    adapters: list[ModelRef] = Field(min_length=1, max_length=256, description="The adapter versions served.")
    policy: Policy

    @field_validator("adapters")
    @classmethod
    def _unique(cls, adapters: list[str]) -> list[str]:
        repeated = sorted({ref for ref in adapters if adapters.count(ref) > 1})
        if repeated:
            raise ValueError(f"each adapter is listed once; repeated: {', '.join(repeated)}")
        return adapters

    @model_validator(mode="wrap")
    @classmethod
    def _validate(cls, data: Any, handler: ModelWrapValidatorHandler[MixtureSpec]) -> MixtureSpec:
        try:
            spec = handler(data)
        except ValidationError as exc:
            raise _invalid(exc) from None
        _check_references(spec)
        return spec

    @property
    def voters(self) -> list[str]:
        """A vote policy's voters (every adapter unless it names them); [] for other policies."""
        if not isinstance(self.policy, VotePolicy):
            return []
        return list(self.policy.voters or self.adapters)

    @property
    def router_candidates(self) -> list[RouterCandidate]:
        """A router_adapter policy's candidates (every adapter unless it names them); [] for other policies."""
        if not isinstance(self.policy, RouterAdapterPolicy):
            return []
        return self.policy.candidates or [RouterCandidate(adapter=ref) for ref in self.adapters]


def _invalid(exc: ValidationError) -> InvalidRequest:
    """The first validation error as `routing <field>: <message>`, with the field as `param`."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    model: type[BaseModel] | None = MixtureSpec if len(loc) == 1 else None
    if len(loc) > 1 and loc[0] == "policy" and loc[1] in POLICY_TYPES:
        model = _POLICY_MODELS[loc[1]] if len(loc) == 3 else None
        del loc[1]  # the union's tag, which pydantic puts in the path
    path = ".".join(loc)
    if error["type"] == "missing":
        message = "is required"
    elif error["type"] == "extra_forbidden":
        options = f"; the options are: {', '.join(model.model_fields)}" if model is not None else ""
        message = f"is not an option here{options}"
    elif error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == ID_PATTERN:
        message = "must be a model reference such as `my-adapter@3` (letters, digits and _.:@-)"
    elif error["type"] in {"union_tag_invalid", "union_tag_not_found"}:
        message = f"type must be one of: {', '.join(POLICY_TYPES)}"
        path = "policy.type"
    else:
        message = str(error["msg"]).removeprefix("Value error, ")
    return InvalidRequest(f"routing {path}: {message}" if path else f"routing: {message}", param=path or None)


def _check_references(spec: MixtureSpec) -> None:
    """Every adapter the policy names must be one of the mixture's adapters."""
    served = set(spec.adapters)

    def check(ref: str | None, path: str) -> None:
        if ref is not None and ref not in served:
            raise InvalidRequest(
                f"routing {path}: {ref!r} is not one of this mixture's adapters; add it to `adapters` "
                f"or use one of: {', '.join(spec.adapters)}",
                param=path,
            )

    policy = spec.policy
    check(getattr(policy, "default", None), "policy.default")
    if isinstance(policy, EmbeddingPolicy):
        for index, candidate in enumerate(policy.candidates):
            check(candidate.adapter, f"policy.candidates.{index}.adapter")
        _check_unique([candidate.adapter for candidate in policy.candidates], "policy.candidates")
    elif isinstance(policy, RulesPolicy):
        for index, rule in enumerate(policy.rules):
            check(rule.adapter, f"policy.rules.{index}.adapter")
    elif isinstance(policy, RouterAdapterPolicy):
        candidates = spec.router_candidates
        for index, candidate in enumerate(policy.candidates or []):
            check(candidate.adapter, f"policy.candidates.{index}.adapter")
        _check_unique([candidate.adapter for candidate in candidates], "policy.candidates")
        labels = [normalize_text(candidate.resolved_label) for candidate in candidates]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise InvalidRequest(
                f"routing policy.candidates: labels must differ (ignoring case and punctuation); repeated: "
                f"{', '.join(repeated)}; give candidates distinct `label`s",
                param="policy.candidates",
            )
    elif isinstance(policy, VotePolicy):
        for index, voter in enumerate(policy.voters or []):
            check(voter, f"policy.voters.{index}")
        voters = spec.voters
        _check_unique(voters, "policy.voters")
        if len(voters) < 2:
            raise InvalidRequest("routing policy.voters: a vote needs at least two voters", param="policy.voters")
        if policy.tie_break is not None and sorted(policy.tie_break) != sorted(voters):
            raise InvalidRequest(
                f"routing policy.tie_break: list every voter exactly once ({', '.join(voters)})",
                param="policy.tie_break",
            )


def _check_unique(refs: list[str], path: str) -> None:
    repeated = sorted({ref for ref in refs if refs.count(ref) > 1})
    if repeated:
        raise InvalidRequest(f"routing {path}: each adapter appears once; repeated: {', '.join(repeated)}", param=path)


# ---- a revision as a node serves it --------------------------------------------------------------


class MixtureTarget(NodeMixture):
    """A mixture deployment's revision as the API names it to a node (`NodeMixture`), its spec
    validated: what the API and the eval runner build and send."""

    spec: MixtureSpec  # type: ignore[assignment]  # the wire's JSON object, validated
