"""Built-in benchmarks, generated offline and deterministically from a seed.

Three benchmarks that need no download, so the whole loop (eval, train, eval again) runs
on any machine:

- `arithmetic`: short-answer sums, differences and products, graded `numeric`.
- `format`: strict output formats: a JSON object with given keys (graded `json_match`) or
  a line `ANSWER: <word>` (graded `regex`, the word compared with the reference).
- `tool_calling`: two-step customer-support tasks with scripted tools: the agent must look
  something up, then act on what it found (find the latest order, then cancel it by the
  id it found), graded `tool_call` over the calls in order.

`load_builtin(name, split, n, seed)` draws `n` distinct tasks. Whether a task belongs to
`train` or `heldout` depends only on its content (a hash), never on the seed, so no seed
can put the same task in both splits; the same seed gives the same tasks in the same order.

Each `Task` carries its `solution`: the ideal continuation in OpenAI chat format (assistant
messages, and the tool messages the environment answers), which scores 1.0 with the task's
own grader and is what mining writes as an SFT row.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mint.chat.tool_calls import ScriptedCall, ToolCall
from mint.errors import ConfigurationError, InvalidRequest
from mint.evals.environments import Environment
from mint.evals.graders import Grade, GradeContext, GraderSpec, Output, grade

Split = Literal["train", "heldout"]
SPLITS: tuple[Split, ...] = ("train", "heldout")
# Share of all possible tasks that belongs to the heldout split.
HELDOUT_PERCENT = 20
MAX_TASKS = 100_000
# Give up drawing after this many draws per requested task: the split is nearly exhausted.
_DRAWS_PER_TASK = 50


class Task(BaseModel):
    """One benchmark task: the conversation so far, the tools and their scripted results, and how to grade.

    `messages` and `tools` are in OpenAI chat format. `environment` scripts each tool's result
    for exact arguments (see `Environment`). `solution` is the ideal continuation.
    Serialises to one JSONL row with `model_dump(mode="json")`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    environment: list[ScriptedCall] = Field(default_factory=list)
    reference: Any
    grader: GraderSpec
    solution: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def make_environment(self) -> Environment:
        """A fresh environment that replays this task's scripted tool results."""
        names = [tool["function"]["name"] for tool in self.tools or [] if isinstance(tool.get("function"), dict)]
        return Environment(self.environment, tool_names=names if self.tools is not None else None)

    def grade(self, output: Output, *, context: GradeContext | None = None) -> Grade:
        """Score an output (a completion, an assistant message or a trajectory) with this task's grader."""
        return grade(self.grader, output, self.reference, context=context)


@dataclass(frozen=True)
class _Draft:
    """A generated task before its id: `key` says what makes it distinct from every other task."""

    key: str
    messages: list[dict[str, Any]]
    reference: Any
    grader: GraderSpec
    solution: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    environment: list[ScriptedCall] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


Generator = Callable[[random.Random], _Draft]
_BUILTINS: dict[str, tuple[str, Generator]] = {}


def _builtin(name: str, description: str) -> Callable[[Generator], Generator]:
    def register(generator: Generator) -> Generator:
        if name in _BUILTINS:
            raise ConfigurationError(f"built-in benchmark {name!r} is defined twice; rename one")
        _BUILTINS[name] = (description, generator)
        return generator

    return register


def builtin_benchmarks() -> dict[str, str]:
    """Each built-in benchmark's name and a one-line description."""
    return {name: description for name, (description, _) in sorted(_BUILTINS.items())}


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


# ---- arithmetic ------------------------------------------------------------------------------


@_builtin("arithmetic", "Short-answer integer arithmetic (+, -, *), graded numeric.")
def _arithmetic(rng: random.Random) -> _Draft:
    operation = rng.choice("+-*")
    if operation == "*":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
    else:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
    answer = {"+": a + b, "-": a - b, "*": a * b}[operation]
    return _Draft(
        key=f"{a}{operation}{b}",
        messages=[_user(f"What is {a} {operation} {b}? Answer with the number only.")],
        reference=str(answer),
        grader=GraderSpec(type="numeric"),
        solution=[_assistant(str(answer))],
        metadata={"operation": operation},
    )


# ---- format ----------------------------------------------------------------------------------

CITY_COUNTRY = {
    "Paris": "France", "Lyon": "France", "Marseille": "France", "Berlin": "Germany", "Munich": "Germany",
    "Hamburg": "Germany", "Madrid": "Spain", "Barcelona": "Spain", "Seville": "Spain", "Rome": "Italy",
    "Milan": "Italy", "Naples": "Italy", "Tokyo": "Japan", "Osaka": "Japan", "Kyoto": "Japan",
    "Lisbon": "Portugal", "Porto": "Portugal", "Amsterdam": "Netherlands", "Rotterdam": "Netherlands",
    "Vienna": "Austria", "Salzburg": "Austria", "Warsaw": "Poland", "Krakow": "Poland", "Cairo": "Egypt",
    "Nairobi": "Kenya", "Toronto": "Canada", "Vancouver": "Canada", "Sydney": "Australia",
    "Melbourne": "Australia", "Chicago": "United States", "Boston": "United States", "Lima": "Peru",
    "Oslo": "Norway", "Bergen": "Norway", "Stockholm": "Sweden", "Dublin": "Ireland", "Athens": "Greece",
    "Prague": "Czechia", "Budapest": "Hungary", "Helsinki": "Finland",
}  # fmt: skip
COUNTRY_CAPITAL = {
    "France": "Paris", "Germany": "Berlin", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo",
    "Portugal": "Lisbon", "Netherlands": "Amsterdam", "Austria": "Vienna", "Poland": "Warsaw", "Egypt": "Cairo",
    "Kenya": "Nairobi", "Canada": "Ottawa", "Australia": "Canberra", "Peru": "Lima", "Norway": "Oslo",
    "Sweden": "Stockholm", "Ireland": "Dublin", "Greece": "Athens", "Czechia": "Prague", "Hungary": "Budapest",
}  # fmt: skip
WORDS = (
    "apple", "river", "mountain", "garden", "window", "silver", "planet", "rocket", "pencil", "forest",
    "candle", "bridge", "dragon", "castle", "harbor", "meadow", "thunder", "velvet", "lantern", "compass",
)  # fmt: skip
_JSON_ONLY = "Reply with the JSON object only."
_ANSWER_FORM = "Answer in the form `ANSWER: <word>`."
# The word after "ANSWER: " is compared with the reference; the rest must be exactly this form.
_ANSWER_GRADER = GraderSpec(type="regex", config={"pattern": r"ANSWER: (\w+)", "group": 1})
_JSON_GRADER = GraderSpec(type="json_match")


def _json_task(key: str, prompt: str, reference: dict[str, Any], template: str) -> _Draft:
    return _Draft(
        key=key,
        messages=[_user(f"{prompt} {_JSON_ONLY}")],
        reference=reference,
        grader=_JSON_GRADER,
        solution=[_assistant(json.dumps(reference))],
        metadata={"template": template},
    )


def _answer_task(key: str, prompt: str, word: str, template: str) -> _Draft:
    return _Draft(
        key=key,
        messages=[_user(f"{prompt} {_ANSWER_FORM}")],
        reference=word,
        grader=_ANSWER_GRADER,
        solution=[_assistant(f"ANSWER: {word}")],
        metadata={"template": template},
    )


@_builtin("format", "Strict output formats: JSON objects with given keys, or `ANSWER: <word>`.")
def _format(rng: random.Random) -> _Draft:
    template = rng.choice(("city_json", "sum_json", "capital_answer", "upper_answer"))
    if template == "city_json":
        city = rng.choice(sorted(CITY_COUNTRY))
        prompt = f"Reply with a JSON object with keys `city` and `country` for: {city}."
        return _json_task(f"{template}|{city}", prompt, {"city": city, "country": CITY_COUNTRY[city]}, template)
    if template == "sum_json":
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        prompt = f"Reply with a JSON object with keys `a`, `b` and `sum`, where a = {a} and b = {b}."
        return _json_task(f"{template}|{a}|{b}", prompt, {"a": a, "b": b, "sum": a + b}, template)
    if template == "capital_answer":
        country = rng.choice(sorted(COUNTRY_CAPITAL))
        prompt = f"What is the capital of {country}?"
        return _answer_task(f"{template}|{country}", prompt, COUNTRY_CAPITAL[country], template)
    word = rng.choice(WORDS)
    return _answer_task(f"{template}|{word}", f"Write the word `{word}` in capital letters.", word.upper(), template)


# ---- triage ----------------------------------------------------------------------------------

TRIAGE_SYSTEM = (
    "Triage the support ticket. Reply with a JSON object only, with keys `team` (billing, technical "
    "or sales) and `priority` (high or low)."
)
TRIAGE_REQUESTS = {
    "billing": ("I was charged twice for {thing}", "My invoice for {thing} is wrong", "Please refund {thing}"),
    "technical": (
        "The page for {thing} shows an error",
        "I cannot log in to {thing}",
        "{thing} crashes when it starts",
    ),
    "sales": ("I would like a quote for {thing}", "Is there a discount on {thing}", "Can we buy more of {thing}"),
}
TRIAGE_THINGS = ("the pro plan", "my account", "the mobile app", "our team seats", "the dashboard", "the API")
TRIAGE_URGENT = ("URGENT: ", "Everything is down! ", "Please fix this today. ")


@_builtin("triage", "Support-ticket triage: JSON `team` and `priority`, graded json_match with partial credit.")
def _triage(rng: random.Random) -> _Draft:
    team = rng.choice(sorted(TRIAGE_REQUESTS))
    request = rng.choice(TRIAGE_REQUESTS[team]).format(thing=rng.choice(TRIAGE_THINGS))
    urgent = rng.choice(("",) * len(TRIAGE_URGENT) + TRIAGE_URGENT)  # half the tickets are urgent
    ticket = f"{urgent}{request[0].upper()}{request[1:]}."
    reference = {"team": team, "priority": "high" if urgent else "low"}
    return _Draft(
        key=ticket,
        messages=[{"role": "system", "content": TRIAGE_SYSTEM}, _user(ticket)],
        reference=reference,
        grader=_JSON_GRADER,
        solution=[_assistant(json.dumps(reference))],
        metadata={"team": team},
    )


# ---- tool_calling ----------------------------------------------------------------------------


def _tool(name: str, description: str, parameters: dict[str, str]) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are all required and typed as given."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": kind} for key, kind in parameters.items()},
                "required": list(parameters),
                "additionalProperties": False,
            },
        },
    }


SHOP_TOOLS = [
    _tool("find_orders", "List a customer's orders by email, most recent first.", {"email": "string"}),
    _tool("lookup_order", "Details of one order: status, total, currency, shipping city.", {"order_id": "string"}),
    _tool("cancel_order", "Cancel an order that has not shipped yet.", {"order_id": "string"}),
    _tool("get_weather", "Current weather in a city.", {"city": "string"}),
    _tool(
        "convert_currency",
        "Convert an amount between currencies (ISO codes).",
        {"amount": "number", "from_currency": "string", "to_currency": "string"},
    ),
]
SHOP_SYSTEM = (
    "You are a customer-support agent for an online shop. Use the tools to look up what you need "
    "before you act, then answer the customer in one sentence."
)
# Units of each currency per euro: fixed, so the environment is deterministic.
EURO_RATES = {"EUR": 1.0, "USD": 1.08, "GBP": 0.85, "JPY": 162.0, "CHF": 0.95}
WEATHER = ("sunny", "cloudy", "rainy", "windy", "snowy")
CUSTOMERS = ("ana", "ben", "chloe", "dmitri", "emma", "farid", "grace", "hugo", "ines", "jonas")


def _order_id(rng: random.Random) -> str:
    return f"A{rng.randint(10000, 99999)}"


def _agent_task(key: str, request: str, steps: list[tuple[ToolCall, Any]], answer: str, scenario: str) -> _Draft:
    """A task whose solution makes `steps` in order (each call with its scripted result), then answers."""
    script = [ScriptedCall(name=call.name, arguments=call.arguments, result=result) for call, result in steps]
    environment = Environment(script)
    solution: list[dict[str, Any]] = []
    for number, (call, _) in enumerate(steps, start=1):
        message = {"role": "assistant", "content": None, "tool_calls": [call.to_openai(f"call_{number}")]}
        # The environment writes the tool messages, so the solution reads exactly what an agent would.
        solution += [message, *environment.step(message)]
    solution.append(_assistant(answer))
    return _Draft(
        key=key,
        messages=[{"role": "system", "content": SHOP_SYSTEM}, _user(request)],
        reference=[{"name": call.name, "arguments": call.arguments} for call, _ in steps],
        grader=GraderSpec(type="tool_call"),
        solution=solution,
        tools=SHOP_TOOLS,
        environment=script,
        metadata={"scenario": scenario, "steps": len(steps)},
    )


@_builtin("tool_calling", "Two-step support tasks with scripted tools (look up, then act), graded tool_call.")
def _tool_calling(rng: random.Random) -> _Draft:
    scenario = rng.choice(("cancel_latest", "order_total", "weather_destination"))
    order_id = _order_id(rng)
    if scenario == "cancel_latest":
        email = f"{rng.choice(CUSTOMERS)}{rng.randint(1, 99)}@example.com"
        older_id = _order_id(rng)
        orders = {
            "orders": [{"order_id": order_id, "status": "processing"}, {"order_id": older_id, "status": "delivered"}]
        }
        steps = [
            (ToolCall("find_orders", {"email": email}), orders),
            (ToolCall("cancel_order", {"order_id": order_id}), {"order_id": order_id, "status": "cancelled"}),
        ]
        request = f"Please cancel my most recent order. My email is {email}."
        return _agent_task(
            f"{scenario}|{email}|{order_id}|{older_id}",
            request,
            steps,
            f"Your order {order_id} has been cancelled.",
            scenario,
        )
    city = rng.choice(sorted(CITY_COUNTRY))
    if scenario == "order_total":
        source, target = rng.sample(sorted(EURO_RATES), 2)
        total = rng.randint(1_000, 50_000) / 100
        converted = round(total / EURO_RATES[source] * EURO_RATES[target], 2)
        order = {"order_id": order_id, "status": "delivered", "total": total, "currency": source, "ship_to_city": city}
        steps = [
            (ToolCall("lookup_order", {"order_id": order_id}), order),
            (
                ToolCall("convert_currency", {"amount": total, "from_currency": source, "to_currency": target}),
                {"amount": converted, "currency": target},
            ),
        ]
        request = f"How much did my order {order_id} cost in {target}?"
        answer = f"Order {order_id} cost {converted:.2f} {target}."
        return _agent_task(f"{scenario}|{order_id}|{total}|{source}|{target}|{city}", request, steps, answer, scenario)
    condition, temperature_c = rng.choice(WEATHER), rng.randint(-10, 35)
    order = {"order_id": order_id, "status": "shipped", "total": 42.0, "currency": "EUR", "ship_to_city": city}
    steps = [
        (ToolCall("lookup_order", {"order_id": order_id}), order),
        (
            ToolCall("get_weather", {"city": city}),
            {"city": city, "condition": condition, "temperature_c": temperature_c},
        ),
    ]
    request = f"What is the weather like in the city my order {order_id} is being shipped to?"
    answer = f"In {city}, where order {order_id} is going, it is {condition} and {temperature_c} °C."
    return _agent_task(f"{scenario}|{order_id}|{city}|{condition}|{temperature_c}", request, steps, answer, scenario)


# ---- loading ---------------------------------------------------------------------------------


def split_of(name: str, key: str) -> Split:
    """Which split a task belongs to, from its content alone: the same task is always in the same split."""
    bucket = int(hashlib.sha256(f"{name}|{key}".encode()).hexdigest()[:8], 16) % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def load_builtin(name: str, split: Split, n: int, seed: int = 0) -> list[Task]:
    """`n` distinct tasks of built-in benchmark `name` from `split`; the same seed gives the same list."""
    if name not in _BUILTINS:
        raise InvalidRequest(
            f"unknown built-in benchmark {name!r}; use one of: {', '.join(sorted(_BUILTINS))}", param="name"
        )
    if split not in SPLITS:
        raise InvalidRequest(f"split must be one of {', '.join(SPLITS)}, got {split!r}", param="split")
    if not 0 <= n <= MAX_TASKS:
        raise InvalidRequest(f"n must be between 0 and {MAX_TASKS}, got {n}", param="n")
    generator = _BUILTINS[name][1]
    # A string seed goes through sha512 in `random`, so the draws do not depend on PYTHONHASHSEED.
    rng = random.Random(f"{name}|{split}|{seed}")
    seen: set[str] = set()
    tasks: list[Task] = []
    for _ in range(_DRAWS_PER_TASK * n + 100):
        if len(tasks) == n:
            break
        draft = generator(rng)
        if draft.key in seen or split_of(name, draft.key) != split:
            continue
        seen.add(draft.key)
        digest = hashlib.sha256(f"{name}|{draft.key}".encode()).hexdigest()[:16]
        tasks.append(
            Task(
                id=f"{name}-{digest}",
                messages=draft.messages,
                tools=draft.tools,
                environment=draft.environment,
                reference=draft.reference,
                grader=draft.grader,
                solution=draft.solution,
                metadata={"benchmark": name, "split": split, **draft.metadata},
            )
        )
    if len(tasks) < n:
        raise InvalidRequest(
            f"only {len(tasks)} distinct {split} tasks of {name!r} could be drawn; ask for fewer", param="n"
        )
    return tasks
