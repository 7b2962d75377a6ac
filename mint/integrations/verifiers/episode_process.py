"""A `verifiers` environment's episodes, played one model turn at a time for Mint.

This file runs as a program of its own, with the Python of the environment's virtualenv (where
`verifiers` is installed; Mint is not): `python episode_process.py ENV.py`. It imports nothing of
Mint, only the standard library, `verifiers` and the `aiohttp` that `verifiers` brings.
`mint env-server` starts it and talks to it over its standard input and output.

A verifiers episode samples by itself: its harness calls an OpenAI-compatible endpoint and the
task's rubric scores the trace when it ends. Mint samples from its own model instead (the policy
an RL job trains, the adapter an eval run measures), so each episode's client is pointed at a
bridge in this process (`/e/{episode}/v1/chat/completions`): a model call the harness makes
waits there until Mint sends the assistant's turn. The episode therefore runs unchanged, its
harness, tools and rubric included, while Mint decides every turn.

The module is loaded as verifiers loads a taskset: its `__all__` names the Taskset and, for an
environment that runs episodes its own way (a game that answers each guess as the user, a user
simulator), an `Env` too; without one the single-agent `Env` plays each task. Every seat runs
in a local subprocess, with the `--harness` given unless the module pins one. A tool server
runs as `python -m MODULE` in a fresh directory, so the module's directory is put on
`PYTHONPATH` and the module must end with `if __name__ == "__main__": ItsToolset.run()` (as
`vf-init --add-tool` writes it); one that does not is refused at load, not after minutes.

The protocol, one JSON object per line each way; requests carry an `id` their answer repeats:
- `{"op": "tasks"}` -> `{"tasks": [{"index", "id", "name", "prompt", "system_prompt"}, ...]}`
- `{"op": "start", "task": INDEX}` -> an observation (below), the episode's first model call
- `{"op": "step", "episode": ID, "message": {assistant message}}` -> the next observation
- `{"op": "close", "episode": ID}` -> `{"closed": true}` (an episode Mint gives up on)
An observation is `{"episode", "messages", "tools", "done": false}` while the harness waits for
a turn (the messages it added since the last turn: tool results, a user's reply; all of them on
the first call), or `{"episode", "messages": [], "done": true, "reward", "rewards", "metrics",
"errors"}` once the episode ended and its rubric scored it.
A failure is `{"id", "error": {"message", "status"}}`: 400 for a request that is wrong, 404 for
an episode that is not running, 500 for the environment failing.
The first line written is `{"ready": true, "tasks": N}`, once the environment is loaded; one
that cannot be loaded ends the process with status 1, the reason last on its standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger("mint.verifiers")

# How long a model call may wait for Mint's turn, and an episode for its next event, before it
# is abandoned (an eval run or job that stopped without closing it).
TURN_WAIT_S = 600.0
BRIDGE_KEY_VARIABLE = "MINT_VERIFIERS_BRIDGE_KEY"


class EpisodeFailed(Exception):
    """A request this process answers with an error; `status` is its HTTP-like code."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status


def _text(content: Any) -> str:
    """A message's content as text (a list of content parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _mint_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message as Mint stores one: text content, tool calls and ids kept."""
    kept: dict[str, Any] = {"role": message.get("role", "user"), "content": _text(message.get("content"))}
    for key in ("tool_calls", "tool_call_id", "name"):
        if message.get(key):
            kept[key] = message[key]
    return kept


def _completion(episode_id: str, model: str, message: dict[str, Any]) -> dict[str, Any]:
    """The chat completion that hands Mint's turn to the harness."""
    reply: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content"))}
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    return {
        "id": f"chatcmpl-{episode_id}-{uuid.uuid4().hex[:8]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": reply, "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _stream(completion: dict[str, Any]) -> bytes:
    """The same completion as server-sent events, for a harness that asked to stream."""
    choice = completion["choices"][0]
    delta = dict(choice["message"])
    if delta.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunks = [
        {**completion, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]},
        {
            **completion,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
        },
    ]
    events = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)
    return events + b"data: [DONE]\n\n"


class LiveEpisode:
    """One episode in play: its harness's pending model call, what Mint has seen of it."""

    def __init__(self, episode_id: str) -> None:
        self.id = episode_id
        self.calls: asyncio.Queue[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = asyncio.Queue()
        self.waiting: asyncio.Future[dict[str, Any]] | None = None  # the harness's call Mint must answer
        self.seen: int = 0  # how many messages of the conversation Mint has been sent, its own turns included
        self.model = "mint"
        self.runner: asyncio.Task[Any] | None = None

    async def next_observation(self) -> dict[str, Any]:
        """Wait for the harness's next model call or for the episode's end."""
        assert self.runner is not None
        call = asyncio.ensure_future(self.calls.get())
        done, _ = await asyncio.wait({call, self.runner}, timeout=TURN_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            body, answer = call.result()
            return self._observe(body, answer)
        call.cancel()
        if self.runner in done:
            return self._ended(self.runner.result())
        raise EpisodeFailed(f"the episode made no model call and did not end within {TURN_WAIT_S:g} s", 500)

    def _observe(self, body: dict[str, Any], answer: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        messages = [_mint_message(message) for message in body.get("messages") or []]
        if len(messages) < self.seen:
            answer.set_exception(RuntimeError("the conversation was rewritten"))
            raise EpisodeFailed(
                f"the harness sent {len(messages)} messages after {self.seen}: it rewrote the conversation "
                "(compaction?), which Mint's append-only episodes cannot follow; turn compaction off",
                500,
            )
        added, self.seen = messages[self.seen :], len(messages)
        self.waiting, self.model = answer, str(body.get("model") or "mint")
        return {"episode": self.id, "messages": added, "tools": body.get("tools") or None, "done": False}

    def _ended(self, episode: Any) -> dict[str, Any]:
        traces = list(episode.traces)
        rewards: dict[str, float] = {}
        metrics: dict[str, float] = {}
        for trace in traces:
            rewards.update({name: reward.value for name, reward in trace.rewards.items() if reward is not None})
            metrics.update({name: value for name, value in trace.metrics.items() if value is not None})
        errors = [f"{error.type}: {error.message}" for error in episode.errors]
        for trace in traces:
            errors += [f"{error.type}: {error.message}" for error in trace.errors]
        return {
            "episode": self.id,
            "messages": [],
            "done": True,
            "reward": sum(trace.reward for trace in traces),
            "rewards": rewards,
            "metrics": metrics,
            "errors": errors,
        }

    def answer(self, message: dict[str, Any]) -> None:
        """Give Mint's turn to the harness's waiting call."""
        if self.waiting is None or self.waiting.done():
            raise EpisodeFailed(f"episode {self.id} is not waiting for a turn", 409)
        self.waiting.set_result(_completion(self.id, self.model, message))
        self.waiting = None
        self.seen += 1


class EpisodeHost:
    """The environment, its tasks, the bridge its harnesses call, and the episodes in play."""

    def __init__(self, environment_file: Path, taskset_args: dict[str, Any], harness: str) -> None:
        import verifiers.v1 as vf

        directory = str(environment_file.parent)
        sys.path.insert(0, directory)
        # verifiers starts each tool server as `python -m MODULE` in a fresh working directory
        # with this process's environment, so the module must be importable from there too.
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [directory, os.environ.get("PYTHONPATH")]))
        taskset_id = environment_file.stem
        self.vf = vf
        # The module's own Env when its `__all__` exports one (a multi-turn game, a user
        # simulator), else the single-agent one; either way every seat plays in this machine.
        self.env = vf.load_environment(
            vf.resolve_env_config(
                {"taskset": {"id": taskset_id, **taskset_args}, **self._seats(vf.env_config_type(taskset_id), harness)}
            )
        )
        self.tasks = list(self.env.taskset)
        self._check_tool_servers()
        self.episodes: dict[str, LiveEpisode] = {}
        self.bridge_url = ""
        self.key = uuid.uuid4().hex
        os.environ[BRIDGE_KEY_VARIABLE] = self.key

    @staticmethod
    def _seats(config: type[Any], harness: str) -> dict[str, Any]:
        """Each seat of the env's config, its unpinned harness set to `harness` and its runtime
        to a local subprocess (verifiers' default runtime is a remote sandbox)."""
        import verifiers.v1 as vf

        seats: dict[str, Any] = {}
        for name, field in config.model_fields.items():
            seat = field.default
            if isinstance(seat, vf.AgentConfig):
                seats[name] = {} if seat.harness is not None else {"harness": {"id": harness}}
                if seat.runtime.type == "prime":
                    seats[name]["runtime"] = {"type": "subprocess"}
        return seats

    def _check_tool_servers(self) -> None:
        """Refuse a tool server whose module never starts it, rather than let each episode
        wait minutes for its port: verifiers runs the module as `python -m`."""
        import ast
        import inspect

        servers = list(self.env.taskset.toolsets(self.env.taskset.config))
        for task in {type(task): task for task in self.tasks}.values():
            servers += type(task).toolsets(task.config)
        for server in servers:
            module = sys.modules.get(type(server).__module__)
            if server.config.url or module is None:
                continue
            try:
                tree = ast.parse(inspect.getsource(module))
            except (OSError, TypeError, SyntaxError):
                continue
            if not any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body):
                raise EpisodeFailed(
                    f"the tool server {type(server).__name__} never starts: verifiers runs it as "
                    f"`python -m {module.__name__}`; end {module.__file__} with "
                    f'`if __name__ == "__main__": {type(server).__name__}.run()`',
                    500,
                )

    async def serve_bridge(self) -> Any:
        """Start the bridge on a free local port; returns its runner (to clean up)."""
        from aiohttp import web

        async def chat(request: web.Request) -> web.StreamResponse:
            episode = self.episodes.get(request.match_info["episode"])
            if request.headers.get("authorization") != f"Bearer {self.key}":
                return web.json_response({"error": {"message": "unknown key"}}, status=401)
            if episode is None:
                return web.json_response({"error": {"message": "the episode is over"}}, status=404)
            body = await request.json()
            answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            await episode.calls.put((body, answer))
            completion = await asyncio.wait_for(answer, TURN_WAIT_S)
            if body.get("stream"):
                return web.Response(body=_stream(completion), content_type="text/event-stream")
            return web.json_response(completion)

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/e/{episode}/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.bridge_url = f"http://127.0.0.1:{port}"
        return runner

    def describe_tasks(self) -> dict[str, Any]:
        return {
            "tasks": [
                {
                    "index": index,
                    "id": task.data.id,
                    "name": task.data.name,
                    "prompt": task.data.prompt,
                    "system_prompt": task.data.system_prompt,
                }
                for index, task in enumerate(self.tasks)
            ]
        }

    async def start(self, request: dict[str, Any]) -> dict[str, Any]:
        index = request.get("task")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.tasks):
            raise EpisodeFailed(f"task must be an index from 0 to {len(self.tasks) - 1}, got {index!r}")
        episode = LiveEpisode(uuid.uuid4().hex[:16])
        client = self.vf.EvalClientConfig(
            base_url=f"{self.bridge_url}/e/{episode.id}/v1", api_key_var=BRIDGE_KEY_VARIABLE
        )
        context = self.vf.ModelContext(client=client, model="mint", sampling=self.vf.SamplingConfig())
        self.episodes[episode.id] = episode
        episode.runner = asyncio.ensure_future(self.env.run_episode(self.tasks[index], context))
        return await self._observe(episode)

    async def step(self, request: dict[str, Any]) -> dict[str, Any]:
        episode = self._episode(request)
        message = request.get("message")
        if not isinstance(message, dict) or message.get("role") != "assistant":
            raise EpisodeFailed('message must be the assistant\'s turn: {"role": "assistant", "content": ...}')
        episode.answer(message)
        return await self._observe(episode)

    async def close(self, request: dict[str, Any]) -> dict[str, Any]:
        episode = self._episode(request)
        self._drop(episode)
        return {"closed": True}

    def _episode(self, request: dict[str, Any]) -> LiveEpisode:
        episode = self.episodes.get(str(request.get("episode")))
        if episode is None:
            raise EpisodeFailed(f"no episode {request.get('episode')!r} is running (it ended, or never began)", 404)
        return episode

    async def _observe(self, episode: LiveEpisode) -> dict[str, Any]:
        try:
            observation = await episode.next_observation()
        except EpisodeFailed:
            self._drop(episode)
            raise
        if observation["done"]:
            self.episodes.pop(episode.id, None)
        return observation

    def _drop(self, episode: LiveEpisode) -> None:
        self.episodes.pop(episode.id, None)
        if episode.waiting is not None and not episode.waiting.done():
            episode.waiting.set_exception(RuntimeError("the episode was closed"))
        if episode.runner is not None:
            episode.runner.cancel()


async def _handle(host: EpisodeHost, line: str, write: Any) -> None:
    request_id: Any = None
    try:
        request = json.loads(line)
        request_id = request.get("id")
        operations = {"start": host.start, "step": host.step, "close": host.close}
        if request.get("op") == "tasks":
            result = host.describe_tasks()
        elif request.get("op") in operations:
            result = await operations[request["op"]](request)
        else:
            raise EpisodeFailed(f"unknown op {request.get('op')!r}: one of tasks, start, step, close")
        write({"id": request_id, "result": result})
    except EpisodeFailed as exc:
        write({"id": request_id, "error": {"message": exc.message, "status": exc.status}})
    except Exception as exc:  # the environment's own failure: reported, the process goes on
        log.exception("request failed")
        write({"id": request_id, "error": {"message": f"{type(exc).__name__}: {exc}", "status": 500}})


async def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "environment", type=Path, help="the environment's module file (its __all__ names its Taskset, and Env if any)"
    )
    parser.add_argument("--taskset-args", default="{}", help="JSON: the taskset config's fields")
    parser.add_argument("--harness", default="null", help="the harness of each seat the module leaves unpinned")
    options = parser.parse_args(arguments)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s:     verifiers: %(message)s")
    try:
        host = EpisodeHost(options.environment.resolve(), json.loads(options.taskset_args), options.harness)
    except EpisodeFailed as exc:
        sys.exit(f"error: {exc.message}")
    out = sys.stdout

    def write(answer: dict[str, Any]) -> None:
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with host.env.serving():
        bridge = await host.serve_bridge()
        write({"ready": True, "tasks": len(host.tasks)})
        pending: set[asyncio.Task[None]] = set()
        while line := (await reader.readline()).decode():
            if line.strip():
                handling = asyncio.ensure_future(_handle(host, line, write))
                pending.add(handling)
                handling.add_done_callback(pending.discard)
        for episode in list(host.episodes.values()):
            host._drop(episode)
        await bridge.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
