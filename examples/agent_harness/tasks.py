"""An order-status desk: a small tool-using task family for the agent harness.

A customer asks about one order; the agent must call `lookup_order(order_id)`, read the
order's history in the result, and answer in one short sentence that names its current status
(the history's last event: "Order A1234 is shipped."). Requests come in four kinds:

- `easy` and `medium`: one order id, said plainly or in a chattier message;
- `distractor`: two orders, the one asked about named again ("A1111 is fine. What about A2222?");
- `ordinal`: two orders, the one asked about named only by position ("... the second one?").

The warm start's demonstrations (split `warmup`) hold the first three kinds only: SFT teaches
the format (call, read, answer) and `ordinal` requests are left for RL to learn from the
live `train` traffic, so the held-out benchmark has headroom after the warm start. Sized for
SmolLM2-135M-Instruct (measured with Mint's trainer and eval runner, greedy, 3 turns): the
base repeats the tools prompt instead of calling the tool (0/20 on a draft of these tasks);
after 6 SFT steps (batch 8, learning rate 1e-3) it solves 16/20 of `held_out`, missing 3 of
5 `ordinal` tasks (it looks up the other order) and one id it copied as `order_A1728`.

Everything here is standard library only, so the harness (`agent.py`) runs with nothing but
the `openai` package:

- `lookup_order` is the shop's database: a carrier, an item count and a dated history of
  events computed from the id alone (the same id always gives the same order), whatever the
  seed.
- `generate_tasks(seed)` draws three disjoint splits (no order id appears in two): `train`
  (the harness's live traffic), `held_out` (never sent by the harness: the benchmark that
  measures improvement) and `warmup` (the SFT warm start's demonstrations, so the warm start
  teaches the format without showing the train or held-out answers).
- `score_episode` is the harness's reward, and the benchmark's grader scores the same way:
  0.8 for a final answer that names the right status, plus 0.2 for exactly one call of
  `lookup_order` with the right id (a composite of `regex` and `tool_call` in Mint's grader
  registry). The harness is stricter in one case the grader cannot express: an answer that
  names several statuses (a hedge) gets no answer credit.
- `write_benchmark` writes tasks as a Mint benchmark file (JSONL, one task per line, each with
  its tool, its scripted environment, its grader and its solution); `write_sft_dataset`
  writes them as a Mint chat dataset (the solution's conversation with the tool call in
  OpenAI's structured form and the tool's result).

    python examples/agent_harness/tasks.py --out build/order-desk --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAMILY = "order-desk"
TOOL_NAME = "lookup_order"
STATUSES = ("processing", "packed", "shipped", "delivered", "delayed", "cancelled", "returned")
# The events an order goes through to reach each status; its current status is the last one.
HISTORIES = {
    "processing": ("processing",),
    "packed": ("processing", "packed"),
    "shipped": ("processing", "packed", "shipped"),
    "delivered": ("processing", "packed", "shipped", "delivered"),
    "delayed": ("processing", "packed", "shipped", "delayed"),
    "cancelled": ("processing", "cancelled"),
    "returned": ("processing", "packed", "shipped", "delivered", "returned"),
}
KINDS = ("easy", "medium", "distractor", "ordinal")
# The warm start is shown these; `ordinal` requests are left for RL.
WARMUP_KINDS = ("easy", "medium", "distractor")
CARRIERS = ("DHL", "UPS", "FedEx", "GLS", "Royal Mail")
ORDER_ID = re.compile(r"^A[0-9]{4}$")
SPLITS = ("train", "held_out", "warmup")
SPLIT_SIZES = {"train": 40, "held_out": 20, "warmup": 64}
# The reward's parts; the benchmark's composite grader uses the same weights.
ANSWER_WEIGHT = 0.8
TOOL_WEIGHT = 0.2

SYSTEM_PROMPT = (
    "You are the order-status desk of an online shop. Look the order up with the lookup_order tool, "
    "then tell the customer its status in one short sentence."
)
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Look up one order by its id (like A1234): its carrier, items and history of events "
        "(the last event is its current status).",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order id, e.g. A1234."}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [LOOKUP_TOOL]

# Requests never name a status word, so the answer has to come from the lookup.
_EASY = (
    "What is the status of order {id}?",
    "Can you check order {id} for me?",
    "Where is my order {id}?",
    "Any news on order {id}?",
)
_MEDIUM = (
    "Hi, I ordered {items} things last week, order number {id}. What is going on with it?",
    "Hello! My order {id} has not reached me yet. Can you tell me where it stands?",
    "I am waiting for order {id}. Could you look it up please?",
)
_DISTRACTOR = (
    "I have two orders, {other} and {id}. {other} is fine. What is the status of {id}?",
    "Order {other} came yesterday, thanks! Could you look up {id} though?",
    "Please ignore {other}, I only care about order {id}. What is its status?",
)
_ORDINAL = (
    "I placed two orders, {first} and {second}. What is the status of the {which} one?",
    "My orders are {first} and {second}. Where is the {which} one?",
    "Two orders: {first}, then {second}. Please check the {which} one.",
)
_NUMBERS = ("two", "three", "four", "five")


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def lookup_order(order_id: str) -> dict[str, Any]:
    """The shop's record of an order, computed from the id alone; an error for an id that is not one."""
    if not isinstance(order_id, str) or not ORDER_ID.match(order_id):
        return {"error": f"no order {order_id!r}; order ids look like A1234"}
    number = _digest(f"{FAMILY}|{order_id}")
    status = STATUSES[number % len(STATUSES)]
    day = 1 + (number // 7) % 10
    history = []
    for event in HISTORIES[status]:
        history.append({"date": f"2026-03-{day:02d}", "event": event})
        day += 1 + (number >> (len(history) * 2)) % 3
    return {
        "order_id": order_id,
        "carrier": CARRIERS[(number // 97) % len(CARRIERS)],
        "items": 1 + (number // 991) % 5,
        "history": history,
    }


def status_of(order_id: str) -> str:
    """An order's current status: the last event of its history."""
    return lookup_order(order_id)["history"][-1]["event"]


def tool_result_text(result: Any) -> str:
    """A tool result as the model reads it: the same JSON text Mint's scripted environments send
    (a benchmark version stores its tasks with sorted keys, so its environment's results have them)."""
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, sort_keys=True)


def call_tool(name: str, arguments: Any) -> str:
    """Answer one tool call of the model (arguments as a JSON string or an object); never raises."""
    if name != TOOL_NAME:
        return tool_result_text({"error": f"unknown tool {name!r}; the tools are: {TOOL_NAME}"})
    parsed = _arguments(arguments)
    if not isinstance(parsed, dict) or set(parsed) != {"order_id"}:
        return tool_result_text({"error": f'{TOOL_NAME} takes {{"order_id": "A1234"}}, got {arguments!r}'})
    return tool_result_text(lookup_order(parsed["order_id"]))


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments
    return arguments


@dataclass(frozen=True)
class Task:
    """One customer request about `order_id` (and perhaps a distractor order)."""

    id: str
    split: str
    order_id: str
    request: str
    kind: str  # one of KINDS
    distractor: str | None = None

    @property
    def status(self) -> str:
        return status_of(self.order_id)

    @property
    def answer(self) -> str:
        return f"Order {self.order_id} is {self.status}."

    @property
    def expected_call(self) -> dict[str, Any]:
        return {"name": TOOL_NAME, "arguments": {"order_id": self.order_id}}

    def messages(self) -> list[dict[str, Any]]:
        """The conversation before the agent's first turn."""
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.request}]

    def solution(self, call_id: str = "call_1") -> list[dict[str, Any]]:
        """The ideal continuation: one lookup, its result, and the answer (OpenAI chat format)."""
        call = {
            "id": call_id,
            "type": "function",
            "function": {"name": TOOL_NAME, "arguments": json.dumps({"order_id": self.order_id})},
        }
        return [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": tool_result_text(lookup_order(self.order_id))},
            {"role": "assistant", "content": self.answer},
        ]


def _draw(rng: random.Random, split: str, kind: str, order_id: str, other: str) -> Task:
    distractor = None
    if kind == "easy":
        request = rng.choice(_EASY).format(id=order_id)
    elif kind == "medium":
        request = rng.choice(_MEDIUM).format(id=order_id, items=rng.choice(_NUMBERS))
    elif kind == "distractor":
        distractor = other
        request = rng.choice(_DISTRACTOR).format(id=order_id, other=other)
    else:
        distractor = other
        which = rng.choice(("first", "second"))
        first, second = (order_id, other) if which == "first" else (other, order_id)
        request = rng.choice(_ORDINAL).format(first=first, second=second, which=which)
    digest = hashlib.sha256(f"{FAMILY}|{split}|{order_id}|{distractor}|{request}".encode()).hexdigest()[:10]
    return Task(
        id=f"{FAMILY}-{split}-{digest}",
        split=split,
        order_id=order_id,
        request=request,
        kind=kind,
        distractor=distractor,
    )


class _Deck:
    """Deals `items` in shuffled rounds: each appears about equally often in any run of deals."""

    def __init__(self, rng: random.Random, items: Sequence[str]) -> None:
        self.rng = rng
        self.items = list(items)
        self.hand: list[str] = []

    def deal(self) -> str:
        if not self.hand:
            self.hand = self.rng.sample(self.items, len(self.items))
        return self.hand.pop()


def generate_tasks(seed: int = 0, sizes: Mapping[str, int] | None = None) -> dict[str, list[Task]]:
    """The splits drawn from `seed` (default sizes: train 40, held_out 20, warmup 64).

    The same seed gives the same tasks in the same order; no order id (target or distractor)
    appears in two tasks, so no split shares an order with another. Statuses and kinds are
    dealt evenly in each split (`warmup` has no `ordinal` tasks).
    """
    sizes = {**SPLIT_SIZES, **(sizes or {})}
    unknown = set(sizes) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)}; the splits are {', '.join(SPLITS)}")
    # A string seed goes through sha512 in `random`: the same draws whatever PYTHONHASHSEED is.
    rng = random.Random(f"{FAMILY}|{seed}")
    ids = [f"A{number}" for number in rng.sample(range(1000, 10000), 9000)]
    by_status: dict[str, list[str]] = {status: [] for status in STATUSES}
    for order_id in ids:
        by_status[status_of(order_id)].append(order_id)
    used: set[str] = set()

    def take(candidates: list[str]) -> str:
        while candidates[-1] in used:
            candidates.pop()
        used.add(candidates[-1])
        return candidates.pop()

    splits: dict[str, list[Task]] = {}
    for split in SPLITS:
        # Dealt in shuffled rounds, so that no answer is right for most tasks of a split.
        statuses = _Deck(rng, STATUSES)
        kinds = _Deck(rng, WARMUP_KINDS if split == "warmup" else KINDS)
        tasks: list[Task] = []
        for _ in range(sizes.get(split, 0)):
            order_id = take(by_status[statuses.deal()])
            tasks.append(_draw(rng, split, kinds.deal(), order_id, take(ids)))
        splits[split] = tasks
    return splits


def load_split(split: str, seed: int = 0) -> list[Task]:
    """One split of `generate_tasks(seed)`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    return generate_tasks(seed)[split]


# ---- the reward ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """An episode's reward and its parts."""

    reward: float
    answer_right: bool
    tool_right: bool
    statuses_named: tuple[str, ...]
    calls: int

    @property
    def label(self) -> str:
        if self.answer_right:
            return "solved" if self.tool_right else "guessed"
        if len(self.statuses_named) > 1:
            return "hedged"
        return "looked_up" if self.tool_right else "wrong"

    @property
    def comment(self) -> str:
        named = ", ".join(self.statuses_named) or "no status"
        return f"{self.calls} tool call(s), lookup {'right' if self.tool_right else 'wrong'}; the answer names {named}"


def _status_pattern(status: str) -> str:
    return rf"\b{status}\b"


def statuses_in(text: str) -> tuple[str, ...]:
    """The status words a text names (whole words, any case), in STATUSES order."""
    return tuple(status for status in STATUSES if re.search(_status_pattern(status), text, re.IGNORECASE))


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    return ""


def _text_calls(text: str) -> list[tuple[str, Any]]:
    """Calls written in Mint's text form (`{"name": ..., "arguments": ...}` objects anywhere in the text)."""
    decoder = json.JSONDecoder()
    calls = []
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except ValueError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict) and isinstance(value.get("name"), str) and "arguments" in value:
            calls.append((value["name"], _arguments(value["arguments"])))
        position = text.find("{", end)
    return calls


def _calls(messages: Iterable[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """Every call the assistant made, in order: its structured `tool_calls`, else calls in its text
    (as Mint reads a trajectory: an eval run's messages carry the calls as text)."""
    calls = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        structured = message.get("tool_calls")
        if not structured:
            calls += _text_calls(_text(message))
            continue
        for call in structured:
            function = call.get("function") or {}
            calls.append((function.get("name", ""), _arguments(function.get("arguments", {}))))
    return calls


def score_episode(task: Task, added: Sequence[Mapping[str, Any]]) -> Score:
    """The reward of the messages an episode added after `task.messages()` (OpenAI format: tool
    calls structured, as the API returns them, or in Mint's text form, as an eval run records them).

    0.8 when the last assistant message names the right status and no other, plus 0.2 when the
    episode made exactly one call and it is `lookup_order` with the right id. The same as
    Mint's grade with `benchmark_grader` except that a hedge gets no answer credit here.
    """
    assistant = [message for message in added if message.get("role") == "assistant"]
    named = statuses_in(_text(assistant[-1])) if assistant else ()
    calls = _calls(added)
    tool_right = len(calls) == 1 and calls[0] == (TOOL_NAME, {"order_id": task.order_id})
    answer_right = named == (task.status,)
    reward = ANSWER_WEIGHT * answer_right + TOOL_WEIGHT * tool_right
    return Score(round(reward, 6), answer_right, tool_right, named, len(calls))


# ---- Mint files ------------------------------------------------------------------------------


def benchmark_grader(task: Task) -> dict[str, Any]:
    """The task's grader in Mint's registry: the status named (regex, 0.8) and the one right lookup
    (tool_call, all or nothing, 0.2). Both parts read the same `reference`, the expected call;
    the regex part has no group, so it reads only the output."""
    return {
        "type": "composite",
        "config": {
            "parts": [
                {
                    "weight": ANSWER_WEIGHT,
                    "grader": {
                        "type": "regex",
                        "config": {"pattern": _status_pattern(task.status), "mode": "search", "ignore_case": True},
                    },
                },
                {"weight": TOOL_WEIGHT, "grader": {"type": "tool_call", "config": {"partial_credit": False}}},
            ]
        },
    }


def benchmark_task(task: Task) -> dict[str, Any]:
    """One Mint benchmark task (a JSONL line of a benchmark file)."""
    scripted = [task.order_id] + ([task.distractor] if task.distractor else [])
    return {
        "id": task.id,
        "messages": task.messages(),
        "tools": TOOLS,
        # The scripted environment answers the ids the request names, as the harness's tool would.
        "environment": [
            {"name": TOOL_NAME, "arguments": {"order_id": order_id}, "result": lookup_order(order_id)}
            for order_id in scripted
        ],
        "reference": task.expected_call,
        "grader": benchmark_grader(task),
        "split": task.split,
        "solution": task.solution(),
        "metadata": {"family": FAMILY, "kind": task.kind, "status": task.status},
    }


def sft_row(task: Task) -> dict[str, Any]:
    """One Mint chat (SFT) row: the whole solved conversation, with the tools it offers."""
    return {"messages": task.messages() + task.solution(), "tools": TOOLS}


def _write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    return path


def write_benchmark(path: str | Path, tasks: Sequence[Task]) -> Path:
    """Write `tasks` as a Mint benchmark file (JSONL; every task carries its own grader):
    `mint benchmarks create order-desk --file PATH`."""
    return _write_jsonl(Path(path), (benchmark_task(task) for task in tasks))


def write_sft_dataset(path: str | Path, tasks: Sequence[Task]) -> Path:
    """Write `tasks`' solutions as a Mint chat dataset: `mint datasets upload PATH --kind chat`."""
    return _write_jsonl(Path(path), (sft_row(task) for task in tasks))


def write_all(out: str | Path, seed: int = 0, sizes: Mapping[str, int] | None = None) -> dict[str, Path]:
    """The held-out benchmark, the warm-start dataset and the train tasks (for reading) under `out`.

    `sizes` as `generate_tasks` takes them. The train split is drawn first, so a larger held-out
    split leaves the train tasks (what the harness sends) as they are and shares no order with them."""
    splits = generate_tasks(seed, sizes)
    folder = Path(out)
    return {
        "benchmark": write_benchmark(folder / "order_desk_benchmark.jsonl", splits["held_out"]),
        "sft": write_sft_dataset(folder / "order_desk_sft.jsonl", splits["warmup"]),
        "train": write_benchmark(folder / "order_desk_train.jsonl", splits["train"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the order desk's held-out benchmark and SFT warm start.")
    parser.add_argument("--out", default="build/order-desk", help="Folder for the files (default: %(default)s).")
    parser.add_argument("--seed", type=int, default=0, help="Which tasks are drawn (default: %(default)s).")
    parser.add_argument(
        "--held-out", type=int, default=SPLIT_SIZES["held_out"], help="Tasks in the benchmark (default: %(default)s)."
    )
    args = parser.parse_args(argv)
    for name, path in write_all(args.out, args.seed, {"held_out": args.held_out}).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
