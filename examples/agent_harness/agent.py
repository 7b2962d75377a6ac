"""An agent harness that talks to a Mint deployment through the OpenAI API, one episode at a time.

Each episode takes a task of the order desk's `train` split (`tasks.py`), runs the agent loop
with the official `openai` client (the model calls `lookup_order`, the harness answers it
locally, the model answers the customer), scores the episode itself, and rewards it on Mint:

- every chat request of the episode carries `X-Mint-Episode: <key>` and `X-Mint-Task: <task
  id>` (episodes of one task form an RL group; the harness runs `--group-size` episodes of
  each task it draws);
- `POST /v1/episodes/{key}/reward` with `{"score", "label", "comment"}` once it has ended
  (`--verify` also reads it back with `GET /v1/episodes/{key}`).

It prints the episodes, the mean reward, the failed requests and episodes per minute, and
exits 1 if any request failed. Only the `openai` package and the standard library:

    python examples/agent_harness/agent.py --base-url http://127.0.0.1:8000/v1 \\
        --api-key $MINT_API_KEY --model order-desk-prod --episodes 20

From Python (a test, a notebook): `run(client, model, tasks, episodes)` returns a `Summary`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai import OpenAI

# tasks.py sits beside this file; run as a script or imported with this folder on sys.path.
_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
import tasks as order_desk  # noqa: E402

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
EPISODE_HEADER = "X-Mint-Episode"
TASK_HEADER = "X-Mint-Task"
MAX_LISTED_ERRORS = 10


@dataclass(frozen=True)
class EpisodeResult:
    """One episode: its key and task, how it ended, and its reward (None if a request failed first)."""

    key: str
    task_id: str
    turns: int
    reward: float | None
    label: str | None
    answer_right: bool = False
    tool_right: bool = False
    rewarded: bool = False
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Summary:
    """What a run did. `mean_reward` is over the episodes that ended (no request failed in them)."""

    episodes: int
    completed: int
    rewarded: int
    mean_reward: float
    solved: int
    right_lookups: int
    requests: int
    failed_requests: int
    elapsed_s: float
    episodes_per_minute: float
    errors: list[str]
    results: list[EpisodeResult]

    @property
    def ok(self) -> bool:
        return self.failed_requests == 0

    def lines(self) -> list[str]:
        lines = [
            f"episodes: {self.episodes} ({self.completed} ended, {self.rewarded} rewarded)",
            f"mean reward: {self.mean_reward:.3f}",
            f"solved: {self.solved}/{self.completed}, right lookups: {self.right_lookups}/{self.completed}",
            f"failed requests: {self.failed_requests} (of {self.requests})",
            f"episodes/minute: {self.episodes_per_minute:.1f} ({self.elapsed_s:.1f} s)",
        ]
        lines += [f"  error: {error}" for error in self.errors[:MAX_LISTED_ERRORS]]
        if len(self.errors) > MAX_LISTED_ERRORS:
            lines.append(f"  ... and {len(self.errors) - MAX_LISTED_ERRORS} more errors")
        return lines


class _Counters:
    """Requests made and failed, shared by the episode threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests = 0
        self.failed = 0
        self.errors: list[str] = []

    def call(self, what: str, request: Callable[[], Any]) -> Any:
        """`request()`, counted; a failure is counted, recorded and raised as `_Failed`."""
        with self.lock:
            self.requests += 1
        try:
            return request()
        except Exception as exc:  # any failure of a request counts, whatever raised it
            message = f"{what}: {type(exc).__name__}: {exc}"
            with self.lock:
                self.failed += 1
                self.errors.append(message)
            raise _Failed(message) from exc


class _Failed(Exception):
    pass


def _seed(seed: int, episode: int, turn: int) -> int:
    # Distinct per episode and turn (episodes of one group must not sample the same), reproducible per run.
    return int(hashlib.sha256(f"{seed}|{episode}|{turn}".encode()).hexdigest()[:12], 16)


def _assistant_message(message: Any) -> dict[str, Any]:
    """The assistant message as the API returned it, to send back on the next turn."""
    reply: dict[str, Any] = {"role": "assistant", "content": message.content}
    calls = [call for call in message.tool_calls or [] if getattr(call, "function", None) is not None]
    if calls:
        reply["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in calls
        ]
    return reply


def _check_reward(client: OpenAI, key: str, posted: float) -> None:
    """Read the episode back (`GET /v1/episodes/{key}`); raise unless it holds the reward posted."""
    episode = client.get(f"/episodes/{key}", cast_to=object)
    got = episode.get("reward") if isinstance(episode, Mapping) else None
    if not isinstance(got, int | float) or abs(got - posted) > 1e-6:
        raise RuntimeError(f"GET /v1/episodes/{key} says reward {got!r}; {posted} was posted")


def run_episode(
    client: OpenAI,
    model: str,
    task: order_desk.Task,
    key: str,
    *,
    index: int = 0,
    seed: int = 0,
    max_turns: int = 3,
    temperature: float = 1.0,
    max_tokens: int = 128,
    reward: bool = True,
    verify: bool = False,
    counters: _Counters | None = None,
) -> EpisodeResult:
    """One episode of `task` under `key`: the agent loop, the score, and (with `reward`) its reward on Mint."""
    counters = counters or _Counters()
    headers = {EPISODE_HEADER: key, TASK_HEADER: task.id}
    messages = task.messages()
    added: list[dict[str, Any]] = []
    turns = 0
    try:
        for turn in range(max_turns):
            response = counters.call(
                f"episode {key} turn {turn + 1}",
                lambda turn=turn: client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=order_desk.TOOLS,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    seed=_seed(seed, index, turn),
                    extra_headers=headers,
                ),
            )
            turns += 1
            reply = _assistant_message(response.choices[0].message)
            messages.append(reply)
            added.append(reply)
            if not reply.get("tool_calls"):
                break  # a final answer
            for call in reply["tool_calls"]:
                function = call["function"]
                result = {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": order_desk.call_tool(function["name"], function["arguments"]),
                }
                messages.append(result)
                added.append(result)
        score = order_desk.score_episode(task, added)
        rewarded = False
        if reward:
            body = {"score": score.reward, "label": score.label, "comment": score.comment}
            counters.call(
                f"episode {key} reward",
                lambda: client.post(f"/episodes/{key}/reward", cast_to=object, body=body),
            )
            rewarded = True
            if verify:
                counters.call(f"episode {key} read", lambda: _check_reward(client, key, score.reward))
    except _Failed as failed:
        return EpisodeResult(key, task.id, turns, None, None, error=str(failed), messages=added)
    return EpisodeResult(
        key,
        task.id,
        turns,
        score.reward,
        score.label,
        answer_right=score.answer_right,
        tool_right=score.tool_right,
        rewarded=rewarded,
        messages=added,
    )


def plan(tasks: Sequence[order_desk.Task], episodes: int, *, seed: int = 0, group_size: int = 4) -> list[Any]:
    """Which task each episode runs: tasks in an order drawn from `seed`, `group_size` episodes each."""
    if not tasks:
        raise ValueError("no tasks to run")
    order = random.Random(f"agent-harness|{seed}").sample(list(tasks), len(tasks))
    return [order[(number // group_size) % len(order)] for number in range(episodes)]


def run(
    client: OpenAI,
    model: str,
    tasks: Sequence[order_desk.Task],
    episodes: int,
    *,
    seed: int = 0,
    concurrency: int = 2,
    max_turns: int = 3,
    group_size: int = 4,
    temperature: float = 1.0,
    max_tokens: int = 128,
    reward: bool = True,
    verify: bool = False,
    run_id: str | None = None,
    on_episode: Callable[[EpisodeResult], None] | None = None,
) -> Summary:
    """Run `episodes` episodes of `tasks` against `model` (a deployment's name), `concurrency` at a time.

    Episode keys are `h-<run_id>-<n>` (`run_id` random unless given, so two runs never share
    a key); each episode's task key is its task's id. Failed requests end their episode
    unrewarded and are counted, never raised.
    """
    if episodes < 0 or concurrency < 1 or max_turns < 1 or group_size < 1:
        raise ValueError("episodes must be >= 0, and concurrency, max_turns and group_size >= 1")
    run_id = run_id or secrets.token_hex(4)
    counters = _Counters()
    chosen = plan(tasks, episodes, seed=seed, group_size=group_size)
    started = time.monotonic()

    def one(number: int) -> EpisodeResult:
        result = run_episode(
            client,
            model,
            chosen[number],
            f"h-{run_id}-{number:05d}",
            index=number,
            seed=seed,
            max_turns=max_turns,
            temperature=temperature,
            max_tokens=max_tokens,
            reward=reward,
            verify=verify,
            counters=counters,
        )
        if on_episode is not None:
            on_episode(result)
        return result

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(episodes)))
    elapsed = time.monotonic() - started
    ended = [result for result in results if result.reward is not None]
    return Summary(
        episodes=episodes,
        completed=len(ended),
        rewarded=sum(result.rewarded for result in results),
        mean_reward=sum(result.reward or 0.0 for result in ended) / len(ended) if ended else 0.0,
        solved=sum(result.answer_right for result in ended),
        right_lookups=sum(result.tool_right for result in ended),
        requests=counters.requests,
        failed_requests=counters.failed,
        elapsed_s=elapsed,
        episodes_per_minute=len(ended) / elapsed * 60 if elapsed > 0 else 0.0,
        errors=list(counters.errors),
        results=results,
    )


# ---- the command -----------------------------------------------------------------------------


def api_base_url(url: str) -> str:
    """The OpenAI base URL: Mint's API URL with `/v1` (added when missing, as MINT_BASE_URL for the CLI has none)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def _api_key(given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("MINT_API_KEY"):
        return os.environ["MINT_API_KEY"]
    # `mint up` writes its admin key here.
    path = Path(os.environ.get("MINT_HOME", Path.home() / ".mint")) / "admin.key"
    return path.read_text().strip() if path.is_file() else None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Run order-desk episodes against a Mint deployment and reward them.",
        epilog="Exit status: 0 when every request succeeded, 1 when any failed, 2 on a usage error.",
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("MINT_BASE_URL", DEFAULT_BASE_URL),
        help="Mint's OpenAI-compatible URL; /v1 is added when missing (default: $MINT_BASE_URL, else %(default)s).",
    )
    parser.add_argument(
        "--api-key", default=None, help="An API key (default: $MINT_API_KEY, else $MINT_HOME/admin.key)."
    )
    parser.add_argument("--model", required=True, help="The deployment's name (what clients send as `model`).")
    parser.add_argument("--episodes", type=int, default=20, help="Episodes to run (default: %(default)s).")
    parser.add_argument("--seed", type=int, default=0, help="Task order and sampling seeds (default: 0).")
    parser.add_argument(
        "--task-seed",
        type=int,
        default=0,
        help="Which tasks make the train split; use the seed the held-out benchmark was written with (default: 0).",
    )
    parser.add_argument("--concurrency", type=int, default=2, help="Episodes at a time (default: %(default)s).")
    parser.add_argument("--max-turns", type=int, default=3, help="Assistant turns per episode (default: 3).")
    parser.add_argument(
        "--group-size", type=int, default=4, help="Episodes per task: an RL group (default: %(default)s)."
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (default: 1.0).")
    parser.add_argument("--max-tokens", type=int, default=128, help="Largest assistant turn (default: 128).")
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds per request (default: 300).")
    parser.add_argument(
        "--max-retries",
        type=int,
        default=0,
        help="The client's retries per request (default: 0: a retried turn could be recorded twice).",
    )
    parser.add_argument("--no-reward", action="store_true", help="Send the traffic but post no reward.")
    parser.add_argument("--verify", action="store_true", help="Read each rewarded episode back and check its reward.")
    parser.add_argument("--quiet", action="store_true", help="Print only the summary, not a line per episode.")
    args = parser.parse_args(argv)
    if args.episodes < 0 or min(args.concurrency, args.max_turns, args.group_size, args.max_tokens) < 1:
        parser.error("--episodes must be >= 0; --concurrency, --max-turns, --group-size, --max-tokens >= 1")
    args.api_key = _api_key(args.api_key)
    if not args.api_key:
        parser.error("no API key: pass --api-key or set MINT_API_KEY")
    return args


def _episode_line(result: EpisodeResult) -> str:
    if result.error is not None:
        return f"{result.key} {result.task_id}: failed after {result.turns} turn(s): {result.error}"
    return f"{result.key} {result.task_id}: reward {result.reward:.2f} ({result.label}, {result.turns} turn(s))"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    client = OpenAI(
        base_url=api_base_url(args.base_url), api_key=args.api_key, timeout=args.timeout, max_retries=args.max_retries
    )
    train = order_desk.load_split("train", seed=args.task_seed)
    summary = run(
        client,
        args.model,
        train,
        args.episodes,
        seed=args.seed,
        concurrency=args.concurrency,
        max_turns=args.max_turns,
        group_size=args.group_size,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        reward=not args.no_reward,
        verify=args.verify,
        on_episode=None if args.quiet else lambda result: print(_episode_line(result), flush=True),
    )
    print("\n".join(summary.lines()))
    return 0 if summary.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
