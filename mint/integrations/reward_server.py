"""The reward server: a team's own reward function, unmodified, behind Mint's remote reward
protocol, in the team's own process (`mint reward-server rewards.py:accuracy`).

Mint's `remote` grader POSTs a signed batch of graded items (`RewardRequest`, signed as Mint's
webhooks are, with the Standard Webhooks scheme) and reads one reward per item back
(`RewardAnswer`). This module loads the function (`load_function`), tells which framework's
calling convention it follows from its parameter names (`detect_style`: TRL's batch of prompts
and completions with the dataset's columns as keyword lists, verl's `compute_score` called once
per item, OpenRLHF's `reward_func(queries, prompts, labels)` on the batch), adapts each request
to that call and the function's return value to the answer (`Scorer`), and serves it over HTTP
(`create_app`, `serve`).

The function runs on the server's main thread, one call at a time, as it would inside its
trainer: reward code is seldom thread-safe, and some of it (math_verify, under TRL's
`accuracy_reward`) times itself out with `signal.alarm`, which only the main thread may use.
Requests that arrive meanwhile wait their turn. A function may also be `async`; it is awaited.

Nothing here imports torch or trl: a tensor a function returns is read through its `.tolist()`.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from standardwebhooks.webhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mint import errors
from mint.integrations.signed_server import MAX_REQUEST_BYTES, check_secret, error_answer, signed_body
from mint.schemas.reward_endpoints import MAX_REWARD_ANSWER_BYTES, REWARD_REQUEST_TYPE

log = logging.getLogger(__name__)

Style = Literal["trl", "verl", "openrlhf"]
STYLES: tuple[Style, ...] = get_args(Style)

# The most items one request may carry.
MAX_ITEMS = 4096
# The longest detail sent for one item (it is shown on the item's trajectory).
DETAIL_CHARS = 300
# Where `mint reward-server` reads its secret when --secret is not given.
SECRET_VARIABLE = "MINT_REWARD_SECRET"

# The arguments each style's function is called with.
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")
OPENRLHF_ARGS = ("queries", "prompts", "labels")
# Keywords a TRL reward function gets besides the dataset's columns (GRPOTrainer passes the same);
# a column of one of these names is not passed (it would clash).
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
DEFAULT_REFERENCE_COLUMN = "solution"  # TRL's accuracy_reward reads the reference as `solution`


# -- The wire ------------------------------------------------------------------------------------


class RewardItem(BaseModel):
    """One graded answer: what the model was asked, what it answered, and the task's reference."""

    model_config = ConfigDict(extra="ignore")

    # The messages before the answer; a string for a task in TRL's standard (non-chat) format.
    prompt: list[dict[str, Any]] | str = Field(default_factory=list)
    # What the model (and a harness's tool results) added, as messages.
    completion: list[dict[str, Any]] = Field(default_factory=list)
    # The text of the model's answer, as Mint's graders read it.
    completion_text: str
    reference: Any = None
    data_source: str | None = None
    extra_info: dict[str, Any] = Field(default_factory=dict)
    # The dataset row's own extra columns (a TRL function takes them as keyword lists).
    columns: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _completion_from_text(self) -> RewardItem:
        # A hand-written request may give only the text: it is then the one assistant message.
        if not self.completion:
            self.completion = [{"role": "assistant", "content": self.completion_text}]
        return self


class RewardRequest(BaseModel):
    """The body Mint's remote grader POSTs."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reward.request"]
    items: list[RewardItem] = Field(min_length=1, max_length=MAX_ITEMS)


class RewardAnswer(BaseModel):
    """The answer: one finite reward per item, in order, and an optional note on each."""

    rewards: list[float]
    details: list[str | None]


def parse_request(body: bytes) -> RewardRequest:
    """The request in `body`, or InvalidRequest naming the first field that is not the protocol."""
    try:
        return RewardRequest.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise errors.InvalidRequest(
            f"the body is not a reward request: {where}: {first['msg']} "
            f'(expected {{"type": "{REWARD_REQUEST_TYPE}", "items": [{{"completion_text": ..., ...}}]}})',
            param=where,
        ) from None


def encode_answer(answer: RewardAnswer) -> bytes:
    """The answer's JSON, within MAX_REWARD_ANSWER_BYTES: the details go if they would not fit."""
    body = json.dumps(answer.model_dump(), allow_nan=False, separators=(",", ":")).encode()
    if len(body) <= MAX_REWARD_ANSWER_BYTES:
        return body
    log.warning("the details made the answer longer than %d bytes: sent without them", MAX_REWARD_ANSWER_BYTES)
    return json.dumps({"rewards": answer.rewards}, allow_nan=False, separators=(",", ":")).encode()


# -- Loading the function ------------------------------------------------------------------------


def load_function(target: str) -> Callable[..., Any]:
    """The function `target` names: `path/to/rewards.py:accuracy` (a file, loaded by its path, so
    that a file inside a package that cannot be imported, such as verl's
    `verl/utils/reward_score/gsm8k.py`, loads without its package) or `package.module:accuracy`
    (an importable module)."""
    source, _, name = target.rpartition(":")
    if not source or not name.isidentifier():
        raise errors.InvalidRequest(
            f"{target!r} names no function: write FILE.py:FUNCTION or MODULE:FUNCTION, e.g. rewards.py:accuracy",
            param="function",
        )
    if source.endswith(".py") or "/" in source or os.sep in source:
        module = _module_from_file(Path(source))
    else:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (source == exc.name or source.startswith(exc.name + ".")):
                raise  # the module exists; something it imports does not: its own traceback says what
            raise errors.InvalidRequest(
                f"no module {source!r} to import (from {target!r}); for a file, give its path ending in .py",
                param="function",
            ) from None
    function = getattr(module, name, None)
    if function is None or not callable(function):
        # dir(), not vars(): a lazy module (trl.rewards) lists names it has not imported yet.
        attributes = vars(module)
        found = sorted(
            key
            for key in dir(module)
            if not key.startswith("_") and (key not in attributes or inspect.isfunction(attributes[key]))
        )
        what = "no" if function is None else "a non-callable"
        raise errors.InvalidRequest(
            f"{source} has {what} {name!r}; its functions: {', '.join(found) or 'none'}", param="function"
        )
    return cast(Callable[..., Any], function)


def _module_from_file(path: Path) -> Any:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise errors.InvalidRequest(f"no file {path} to load the reward function from", param="function")
    # A name of its own, so that a file called math.py or gsm8k.py shadows nothing in sys.modules.
    name = f"_mint_rewards_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise errors.InvalidRequest(f"{path} is not a Python file Python can load", param="function")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickle look a function's module up by its name
    # Its sibling helpers import as they would beside a script; searched last, they shadow nothing.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec.loader.exec_module(module)
    return module


# -- Styles ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """What a function's parameters say about how it can be called."""

    names: frozenset[str]  # parameters that may be passed by keyword
    required: frozenset[str]  # those without a default
    takes_kwargs: bool  # it has **kwargs
    inner: inspect.Signature

    @classmethod
    def of(cls, function: Callable[..., Any]) -> Signature:
        try:
            inner = inspect.signature(function)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidRequest(f"cannot read the parameters of {describe(function)}: {exc}") from None
        named = [p for p in inner.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        return cls(
            names=frozenset(p.name for p in named if p.kind is not p.POSITIONAL_ONLY),
            required=frozenset(p.name for p in named if p.default is p.empty),
            takes_kwargs=any(p.kind is p.VAR_KEYWORD for p in inner.parameters.values()),
            inner=inner,
        )

    def keywords(self, offered: Mapping[str, Any]) -> dict[str, Any]:
        """The keywords of `offered` it takes: all of them with **kwargs, else those it names."""
        return dict(offered) if self.takes_kwargs else {k: v for k, v in offered.items() if k in self.names}


@dataclass(frozen=True)
class Detected:
    style: Style
    reason: str


STYLE_SHAPES = (
    "a TRL function takes `completions` (and `prompts`, the dataset's columns as keywords, **kwargs); "
    "a verl function any of `data_source, solution_str, ground_truth, extra_info`; "
    "an OpenRLHF function `queries, prompts, labels`"
)


def describe(function: Callable[..., Any]) -> str:
    name = getattr(function, "__qualname__", None) or type(function).__name__
    try:
        return f"{name}{inspect.signature(function)}"
    except (TypeError, ValueError):
        return name


def detect_style(function: Callable[..., Any], style: Style | None = None) -> Detected:
    """The style `function` is called in: `style` if given, else the one its parameter names
    fit, with the reason; InvalidRequest (saying what would fit) if none does, or it cannot take
    its style's call."""
    signature = Signature.of(function)
    if style is not None:
        _check_fits(function, signature, style)
        return Detected(style, "named by --style")
    # `queries` is OpenRLHF's alone and `completions` TRL's alone; verl's names decide only without
    # them (a TRL function often reads a `ground_truth` column, say).
    if "queries" in signature.names and "completions" in signature.names:
        raise errors.InvalidRequest(
            f"{describe(function)} takes both `queries` (OpenRLHF) and `completions` (TRL): "
            "name the style to use with --style",
            param="style",
        )
    verl = [name for name in VERL_ARGS[:3] if name in signature.names]
    if "queries" in signature.names:
        detected = Detected(
            "openrlhf", "it takes `queries`: OpenRLHF's reward_func(queries, prompts, labels), on the batch"
        )
    elif "completions" in signature.names:
        detected = Detected(
            "trl", "it takes `completions`: TRL's reward function, on the batch, with the dataset's columns as keywords"
        )
    elif verl:
        detected = Detected("verl", f"it takes `{', '.join(verl)}`: verl's compute_score, once per item")
    else:
        hint = ""
        if "completion_ids" in signature.names:
            hint = " (it reads token ids, which Mint's reward requests do not carry)"
        raise errors.InvalidRequest(
            f"{describe(function)} fits no reward style that Mint serves{hint}: {STYLE_SHAPES}. "
            "Rename its parameters, wrap it in a function that fits, or name the style with --style",
            param="style",
        )
    _check_fits(function, signature, detected.style)
    return detected


def _check_fits(function: Callable[..., Any], signature: Signature, style: Style) -> None:
    """InvalidRequest if `function` cannot take `style`'s call whatever the request holds."""
    problem = None
    if style == "trl" and "completions" not in signature.names and not signature.takes_kwargs:
        problem = "a TRL function must take `completions` (or **kwargs)"
    elif style == "verl":
        extra = sorted(signature.required - set(VERL_ARGS))
        if extra:
            problem = f"verl passes only {', '.join(VERL_ARGS)}, and it also needs {', '.join(extra)}"
        elif not signature.takes_kwargs and not signature.names & set(VERL_ARGS):
            problem = f"a verl function must take some of {', '.join(VERL_ARGS)}"
    elif style == "openrlhf":
        try:
            signature.inner.bind(None, None, None)
        except TypeError:
            problem = f"an OpenRLHF function is called as reward_func({', '.join(OPENRLHF_ARGS)})"
    if problem:
        raise errors.InvalidRequest(f"{describe(function)} cannot be served as {style}: {problem}", param="style")


# -- Adapting a request to the function --------------------------------------------------------


class CallRefused(errors.InvalidRequest):
    """The request is the protocol, but the function cannot be called with what it carries
    (say, a TRL function needs a column the items do not have). Answered 422: Mint does not
    retry it."""


class RewardFunctionFailed(Exception):
    """The function raised, or returned something that is not one reward per item. Answered 500
    with the exception's type and message, which Mint shows on the trajectory."""

    def __init__(self, exception: str, message: str) -> None:
        super().__init__(f"{exception}: {message}")
        self.exception = exception
        self.message = message


@dataclass
class _Logged:
    """What a TRL function logs through `log_extra` (one value per item: sent as details) and
    `log_metric` (a scalar per batch: only logged here)."""

    extra: dict[str, list[Any]] = field(default_factory=dict)

    def log_extra(self, column: str, values: list[Any]) -> None:
        self.extra.setdefault(column, []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        log.info("metric %s = %s", name, value)


def _as_list(value: Any, what: str) -> list[Any]:
    if hasattr(value, "tolist"):  # a tensor or an array
        value = value.tolist()
    if isinstance(value, list | tuple):
        return list(value)
    raise RewardFunctionFailed("TypeError", f"{what} is a {type(value).__name__}, not a list of numbers")


def _reward(value: Any, where: str) -> float | None:
    """A number, read as the trainers read one: a tensor's value, a one-element list's element."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    while isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if value is None:
        return None
    if isinstance(value, bool | int | float):
        number = float(value)
        if not math.isfinite(number):
            raise RewardFunctionFailed("ValueError", f"{where} is {number}, not a finite number")
        return number
    raise RewardFunctionFailed("TypeError", f"{where} is {value!r}, not a number")


def _text(value: Any) -> str:
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)


def _detail(pairs: Mapping[str, Any]) -> str | None:
    """`key=value; ...` of what a function said about one item besides its reward."""
    if not pairs:
        return None
    text = "; ".join(f"{key}={_text(value)}" for key, value in pairs.items())
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 3] + "..."


def prompt_text(prompt: list[dict[str, Any]] | str) -> str:
    """A prompt as OpenRLHF's text: each message's content on its own line (Mint does not know
    the model's chat template, so no role markers are added)."""
    if isinstance(prompt, str):
        return prompt
    return "".join(f"{message.get('content') or ''}\n" for message in prompt)


NONE_DETAIL = "the reward function returned None (it does not apply to this item): scored 0.0"


@dataclass(frozen=True)
class Scorer:
    """A loaded reward function and the style it is called in: a request's items in, an answer out."""

    function: Callable[..., Any]
    style: Style
    reference_column: str = DEFAULT_REFERENCE_COLUMN

    def __post_init__(self) -> None:
        if not self.reference_column.isidentifier() or self.reference_column in TRL_KEYWORDS:
            raise errors.InvalidRequest(
                f"the reference column {self.reference_column!r} must be a Python name other than "
                f"{', '.join(TRL_KEYWORDS)}",
                param="reference_column",
            )

    @cached_property
    def signature(self) -> Signature:
        return Signature.of(self.function)

    async def score(self, items: list[RewardItem]) -> RewardAnswer:
        if self.style == "trl":
            return await self._trl(items)
        if self.style == "verl":
            return await self._verl(items)
        return await self._openrlhf(items)

    async def _call(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self.signature.inner.bind(*args, **kwargs)
        except TypeError as exc:
            raise self._refused(exc, kwargs) from None
        try:
            result = self.function(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            log.exception("the reward function raised")
            raise RewardFunctionFailed(type(exc).__name__, str(exc)) from exc
        return result

    def _refused(self, exc: TypeError, offered: Mapping[str, Any]) -> CallRefused:
        message = f"{describe(self.function)} cannot take this request's items ({exc})"
        if self.style == "trl":
            columns = sorted(set(offered) - set(TRL_KEYWORDS))
            message += (
                f": it gets the items' columns as keywords ({', '.join(columns)}), the reference as "
                f"`{self.reference_column}` (--reference-column)"
            )
        return CallRefused(message, param="items")

    async def _trl(self, items: list[RewardItem]) -> RewardAnswer:
        logged = _Logged()
        # TRL's conversational format where the prompt is messages, its standard one (strings) otherwise.
        completions = [item.completion if isinstance(item.prompt, list) else item.completion_text for item in items]
        offered: dict[str, Any] = {
            "prompts": [item.prompt for item in items],
            "completions": completions,
            "completion_ids": None,  # Mint's requests carry text, not token ids
            "trainer_state": None,
            "log_extra": logged.log_extra,
            "log_metric": logged.log_metric,
        }
        names = sorted({key for item in items for key in item.columns} | {self.reference_column})
        for name in names:
            if name not in TRL_KEYWORDS:
                offered[name] = [
                    item.columns.get(name, item.reference if name == self.reference_column else None) for item in items
                ]
        result = await self._call(**self.signature.keywords(offered))
        values = _as_list(result, "what the reward function returned")
        if len(values) != len(items):
            raise RewardFunctionFailed(
                "ValueError", f"the reward function returned {len(values)} rewards for {len(items)} completions"
            )
        per_item = {column: entries for column, entries in logged.extra.items() if len(entries) == len(items)}
        extras = [{column: column_values[i] for column, column_values in per_item.items()} for i in range(len(items))]
        return _answer([_reward(value, f"reward {i}") for i, value in enumerate(values)], extras)

    async def _verl(self, items: list[RewardItem]) -> RewardAnswer:
        rewards: list[float | None] = []
        extras: list[dict[str, Any]] = []
        for i, item in enumerate(items):
            offered = {
                "data_source": item.data_source,
                "solution_str": item.completion_text,
                "ground_truth": item.reference,
                "extra_info": item.extra_info,
            }
            result = await self._call(**self.signature.keywords(offered))
            extra: dict[str, Any] = {}
            if isinstance(result, Mapping):
                if "score" not in result:
                    raise RewardFunctionFailed(
                        "KeyError", f"the reward function returned a dict without 'score' (keys: {', '.join(result)})"
                    )
                extra = {key: value for key, value in result.items() if key != "score"}
                result = result["score"]
            rewards.append(_reward(result, f"the score of item {i}"))
            extras.append(extra)
        return _answer(rewards, extras)

    async def _openrlhf(self, items: list[RewardItem]) -> RewardAnswer:
        prompts = [prompt_text(item.prompt) for item in items]
        queries = [prompt + item.completion_text for prompt, item in zip(prompts, items, strict=True)]
        labels = [item.reference for item in items]
        result = await self._call(queries, prompts, labels)
        extras: list[dict[str, Any]] = [{} for _ in items]
        if isinstance(result, Mapping):
            if "rewards" not in result:
                raise RewardFunctionFailed(
                    "KeyError", f"the reward function returned a dict without 'rewards' (keys: {', '.join(result)})"
                )
            per_item = {"score": result.get("scores"), **dict(result.get("extra_logs") or {})}
            for key, value in per_item.items():
                column = value.tolist() if hasattr(value, "tolist") else value
                if isinstance(column, list) and len(column) == len(items):
                    for extra, entry in zip(extras, column, strict=True):
                        extra[key] = entry
            result = result["rewards"]
        values = _as_list(result, "the rewards the reward function returned")
        if len(values) != len(items):
            raise RewardFunctionFailed(
                "ValueError", f"the reward function returned {len(values)} rewards for {len(items)} queries"
            )
        rewards = [_reward(value, f"reward {i}") for i, value in enumerate(values)]
        for reward, extra in zip(rewards, extras, strict=True):
            if extra.get("score") == reward:
                del extra["score"]  # the usual case: scores are the rewards; nothing to tell
        return _answer(rewards, extras)


def _answer(rewards: list[float | None], extras: list[dict[str, Any]]) -> RewardAnswer:
    details = [NONE_DETAIL if reward is None else _detail(extra) for reward, extra in zip(rewards, extras, strict=True)]
    return RewardAnswer(rewards=[0.0 if reward is None else reward for reward in rewards], details=details)


# -- HTTP ----------------------------------------------------------------------------------------


def create_app(scorer: Scorer, secret: str, *, max_request_bytes: int = MAX_REQUEST_BYTES) -> Starlette:
    """The server: `POST` (any path) scores a signed reward request; `GET /health` says it is up."""
    signer = Webhook(check_secret(secret, SECRET_VARIABLE))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "style": scorer.style})

    async def rewards(request: Request) -> Response:
        body = await signed_body(request, signer, max_request_bytes)
        if isinstance(body, Response):
            return body
        try:
            reward_request = parse_request(body)
        except errors.InvalidRequest as exc:
            return error_answer(400, exc.type, exc.message, param=exc.param or "body")
        began = time.perf_counter()
        try:
            answer = await scorer.score(reward_request.items)
        except CallRefused as exc:
            return error_answer(422, exc.type, exc.message, param=exc.param or "items")
        except RewardFunctionFailed as exc:
            return error_answer(500, "reward_function_error", str(exc), exception=exc.exception)
        log.info(
            "scored %d item(s) in %.0f ms (mean reward %.4g)",
            len(answer.rewards),
            (time.perf_counter() - began) * 1000,
            sum(answer.rewards) / len(answer.rewards),
        )
        return Response(encode_answer(answer), media_type="application/json")

    return Starlette(
        routes=[Route("/health", health, methods=["GET"]), Route("/{path:path}", rewards, methods=["POST"])]
    )
