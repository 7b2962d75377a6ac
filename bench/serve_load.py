"""Inference under load: many concurrent OpenAI requests through the API to the serving nodes of a base.

The platform runs as in production, on the current settings (the embedded defaults in a
temporary MINT_HOME unless MINT_HOME or MINT_DATABASE_URL say otherwise): `mint api` and
`--nodes` processes of `mint serve --base tiny-glm-moe` as subprocesses. Two adapter versions
are registered (fresh LoRA sessions of the base, saved as a job saves them), so requests spread
over the base and both adapters; half of them stream.

For each concurrency level, that many chat completions are sent at once; the bench prints
errors by status (goal: 0), p50 and p95 latency (to the last byte), and completion tokens
per second over the level's wall time.

Then the cost of production capture: three deployments of the same adapter version, one that
captures none, one that captures every request, and one that records every request token-exact
as an episode's turn (capture with `tokens`, each request marked), are sent the same load in
turns (`--rounds` of each, alternating), and the bench prints requests per second of each and
their ratios to the first, and how many captures and episodes were written and dropped.

Then, with `--kill-node-after K`, a node's death under steady traffic: `--concurrency` clients
each send one request after another (pausing ERROR_PAUSE_S after a failed one, as a client
backs off), `--requests` in all; once K have finished, one node is killed with SIGKILL and
started again RESTART_AFTER_S later at its address (as `mint up`'s supervisor does). The bench
prints the errors by status and per 1,000 requests, and when the node was back. With one node
the base is down until the node is back; with two, the API moves on to the other node (the
streams the killed node had started end with an error event: counted as 599).

    .venv/bin/python bench/serve_load.py [--levels 64,256] [--max-tokens 16] [--capture-level 64] [--rounds 3]
    .venv/bin/python bench/serve_load.py --nodes 2 --levels '' --capture-level 0 --requests 300 --kill-node-after 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE = "tiny-glm-moe"
QUESTION = [{"role": "user", "content": "Name three rivers of Europe."}]
ERROR_PAUSE_S = 0.5  # what a client of the steady run waits after a failed request
RESTART_AFTER_S = 2.0  # `mint up`'s first restart backoff (mint.cli.supervisor.RestartPolicy)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(condition: Any, what: str, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"gave up waiting for {what}")


def register_adapters(settings: Any, organization_id: str, count: int) -> list[str]:
    """`count` adapter versions of BASE (fresh LoRA sessions, seeded), as a finished job stores them."""
    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.services import catalog
    from mint.services.models import adapters
    from mint.storage.db import session_scope
    from mint.storage.objects import object_store_for
    from mint.storage.tables import Adapter
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import LoraOptions

    resident = ResidentBase(get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models"), settings.models_cache_dir)
    refs = []
    with tempfile.TemporaryDirectory(prefix="mint-load-") as tmp:
        for index in range(count):
            session = resident.create_session(LoraOptions(seed=index))
            folder = session.save_weights_for_sampler(Path(tmp) / f"adapter-{index}")
            resident.close(session.session_id)
            with session_scope(settings.database) as db:
                version = adapters.register_version(
                    db,
                    object_store_for(settings),
                    organization_id=organization_id,
                    name=f"load-{index}",
                    base_model=BASE,
                    archive=adapters.archive_adapter(folder),
                    lora={"rank": 16, "alpha": 32},
                )
                refs.append(catalog.model_ref_of(db.get(Adapter, version.adapter_id), version))
    return refs


async def one(
    client: httpx.AsyncClient, model: str, stream: bool, max_tokens: int, episode: str | None = None
) -> tuple[int, float, int]:
    """(status, latency s, completion tokens) of one chat completion; with `episode`, marked as
    that episode's turn."""
    body: dict[str, Any] = {
        "model": model,
        "messages": QUESTION,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "stream": stream,
    }
    if episode is not None:
        body["episode"] = {"id": episode, "task": "load"}
    if stream:
        body["stream_options"] = {"include_usage": True}
    started = time.perf_counter()
    tokens = 0
    try:
        if stream:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            return 599, time.perf_counter() - started, 0  # an error inside the stream
                        if chunk.get("usage"):
                            tokens = chunk["usage"]["completion_tokens"]
                status = response.status_code
        else:
            response = await client.post("/v1/chat/completions", json=body)
            status = response.status_code
            if status == 200:
                tokens = response.json()["usage"]["completion_tokens"]
    except httpx.HTTPError:
        status = 0  # no answer
    return status, time.perf_counter() - started, tokens


async def level(
    api_url: str, key: str, models: list[str], concurrency: int, max_tokens: int, *, episodes: str | None = None
) -> dict[str, Any]:
    """One level of load: `concurrency` completions at once, half streamed; with `episodes`, each
    marked as the turn of an episode keyed from it."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=600, limits=limits) as client:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(
                one(client, models[n % len(models)], n % 2 == 1, max_tokens, f"{episodes}-{n}" if episodes else None)
                for n in range(concurrency)
            )
        )
        wall_s = time.perf_counter() - started
    latencies = sorted(latency for status, latency, _ in results if status == 200)
    errors = Counter(status for status, _, _ in results if status != 200)
    return {
        "concurrency": concurrency,
        "errors": dict(errors),
        "p50_s": statistics.median(latencies) if latencies else float("nan"),
        "p95_s": latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else float("nan"),
        "tokens_per_s": sum(tokens for _, _, tokens in results) / wall_s,
        "wall_s": wall_s,
    }


class Nodes:
    """The serving node processes of BASE, each on its own port: started, killed, started again."""

    def __init__(self, env: dict[str, str], count: int) -> None:
        self.env = env
        self.ports = [free_port() for _ in range(count)]
        self.processes = [self._start(port) for port in self.ports]

    def _start(self, port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "mint", "serve", "--base", BASE, "--port", str(port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill_and_restart(self, index: int, settings: Any, report: dict[str, float]) -> None:
        """SIGKILL node `index`, start it again RESTART_AFTER_S later at its port, and record in
        `report` when it was killed and how long until it registered again."""
        from mint.services.serving.nodes import live_nodes
        from mint.storage.db import session_scope

        killed_at = time.perf_counter()
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()
        report["killed_at"] = killed_at
        time.sleep(RESTART_AFTER_S)
        self.processes[index] = self._start(self.ports[index])
        pid = self.processes[index].pid

        def back() -> bool:
            with session_scope(settings.database) as session:
                return any(node.pid == pid for node in live_nodes(session, BASE))

        wait_for(back, "the killed node to be back")
        report["back_after_s"] = time.perf_counter() - killed_at

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


async def steady(
    api_url: str, key: str, models: list[str], requests: int, concurrency: int, max_tokens: int, on_finished: Any
) -> list[tuple[int, float, int]]:
    """`requests` chat completions from `concurrency` clients, each sending one after another;
    `on_finished(count)` is called as each finishes."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    results: list[tuple[int, float, int]] = []
    taken = 0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal taken
        while taken < requests:
            number = taken
            taken += 1
            result = await one(client, models[number % len(models)], number % 2 == 1, max_tokens)
            results.append(result)
            on_finished(len(results))
            if result[0] != 200:
                await asyncio.sleep(ERROR_PAUSE_S)

    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=600, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return results


def node_death(
    api_url: str, key: str, models: list[str], nodes: Nodes, settings: Any, args: argparse.Namespace
) -> None:
    """The steady run with one node killed after `--kill-node-after` requests: errors per 1,000."""
    report: dict[str, float] = {}
    killer: list[threading.Thread] = []

    def on_finished(count: int) -> None:
        if count == args.kill_node_after and not killer:
            thread = threading.Thread(target=nodes.kill_and_restart, args=(0, settings, report), daemon=True)
            thread.start()
            killer.append(thread)

    started = time.perf_counter()
    results = asyncio.run(steady(api_url, key, models, args.requests, args.concurrency, args.max_tokens, on_finished))
    wall_s = time.perf_counter() - started
    for thread in killer:
        thread.join()
    errors = Counter(status for status, _, _ in results if status != 200)
    latencies = sorted(latency for status, latency, _ in results if status == 200)
    failed = sum(errors.values())
    p50 = statistics.median(latencies) if latencies else float("nan")
    p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))] if latencies else float("nan")
    print(
        f"node death: {len(nodes.ports)} node(s), {len(results)} requests from {args.concurrency} clients in "
        f"{wall_s:.1f}s; one node SIGKILLed after {args.kill_node_after} and back {report.get('back_after_s', 0):.1f}s "
        f"later; errors {failed} {dict(errors) if failed else ''}= {1000 * failed / len(results):.1f} per 1,000 "
        f"requests; p50 {p50:.2f}s, p95 {p95:.2f}s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="64,256", help="Comma-separated numbers of concurrent requests.")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=2)
    parser.add_argument("--capture-level", type=int, default=64, help="Concurrency of the capture comparison; 0: none.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds of each deployment in the capture comparison.")
    parser.add_argument("--nodes", type=int, default=1, help="Serving nodes of the base, each a `mint serve` process.")
    parser.add_argument(
        "--kill-node-after",
        type=int,
        default=0,
        help="Run the steady traffic of --requests and SIGKILL one node once this many have finished; 0: no such run.",
    )
    parser.add_argument("--requests", type=int, default=300, help="Requests of the steady run (--kill-node-after).")
    parser.add_argument("--concurrency", type=int, default=16, help="Clients of the steady run.")
    args = parser.parse_args()
    if "MINT_HOME" not in os.environ:
        os.environ["MINT_HOME"] = tempfile.mkdtemp(prefix="mint-serve-load-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    api_port = free_port()
    os.environ["MINT_API_PORT"] = str(api_port)

    from mint.config import get_settings
    from mint.services.serving.nodes import live_nodes
    from mint.services.setup import initialize
    from mint.storage.db import session_scope

    settings = get_settings()
    result = initialize(settings, organization_name="load")
    assert result.admin_key is not None, "MINT_HOME is already initialized; use a fresh one"
    models = [BASE, *register_adapters(settings, result.organization_id, args.adapters)]
    env = os.environ.copy()
    api = subprocess.Popen([sys.executable, "-m", "mint", "api"], env=env, stdout=subprocess.DEVNULL)
    nodes = Nodes(env, args.nodes)
    try:

        def nodes_up() -> bool:
            with session_scope(settings.database) as session:
                return len(live_nodes(session, BASE)) >= args.nodes

        wait_for(nodes_up, "the serving nodes to register")
        api_url = f"http://127.0.0.1:{api_port}"
        wait_for(lambda: _ready(api_url), "the API")
        print(
            f"database {settings.database.split('://')[0]}; {args.nodes} node(s) of {BASE}; "
            f"models {', '.join(models)}; half the requests stream"
        )
        asyncio.run(level(api_url, result.admin_key, models, 8, args.max_tokens))  # warm the adapter cache
        print(f"{'concurrency':>11} {'errors':>14} {'p50':>8} {'p95':>8} {'tokens/s':>9} {'wall':>7}")
        for concurrency in (int(n) for n in args.levels.split(",") if n.strip()):
            row = asyncio.run(level(api_url, result.admin_key, models, concurrency, args.max_tokens))
            errors = sum(row["errors"].values())
            shown = f"{errors} {row['errors']}" if errors else "0"
            print(
                f"{concurrency:>11} {shown:>14} {row['p50_s']:7.2f}s {row['p95_s']:7.2f}s "
                f"{row['tokens_per_s']:9.1f} {row['wall_s']:6.1f}s"
            )
        if args.capture_level:
            capture_cost(api_url, result.admin_key, models[1], args.capture_level, args.max_tokens, args.rounds)
        if args.kill_node_after:
            node_death(api_url, result.admin_key, models, nodes, settings, args)
    finally:
        nodes.stop()
        api.send_signal(signal.SIGTERM)
        try:
            api.wait(timeout=30)
        except subprocess.TimeoutExpired:
            api.kill()


def capture_cost(api_url: str, key: str, version: str, concurrency: int, max_tokens: int, rounds: int) -> None:
    """Requests per second through three deployments of the same version, in alternating
    rounds: one that captures none, one that captures every request, and one that records every
    request token-exact as the turn of an episode (capture with `tokens`, requests marked)."""
    headers = {"Authorization": f"Bearer {key}"}
    settings = {
        "load-plain": {"rate": 0.0},
        "load-captured": {"rate": 1.0},
        "load-episodes": {"rate": 1.0, "tokens": True},
    }
    with httpx.Client(base_url=api_url, headers=headers, timeout=60) as api:
        for name, capture in settings.items():
            api.post("/v1/deployments", json={"name": name, "model": version}).raise_for_status()
            api.patch(f"/v1/deployments/{name}/capture", json=capture).raise_for_status()
        walls: dict[str, float] = dict.fromkeys(settings, 0.0)
        for number in range(rounds):
            for name in walls:
                episodes = f"load-{number}" if name == "load-episodes" else None
                row = asyncio.run(level(api_url, key, [name], concurrency, max_tokens, episodes=episodes))
                assert not row["errors"], row
                walls[name] += row["wall_s"]
        plain, captured, tokens = (rounds * concurrency / walls[name] for name in settings)
        stored = api.get("/v1/deployments/load-captured/captures", params={"limit": 100}).json()
        recorded = api.get("/v1/episodes", params={"deployment": "load-episodes", "limit": 100}).json()
        metrics = api.get("/metrics").text
    counted = [line.split()[-1] for line in metrics.splitlines() if line.startswith("mint_captures_dropped_total")]
    dropped = counted[0] if counted else "0"
    print(
        f"capture at concurrency {concurrency}, {rounds} rounds each: {plain:.1f} req/s without, {captured:.1f} req/s "
        f"with every request captured (ratio {captured / plain:.3f}), {tokens:.1f} req/s with every request recorded "
        f"token-exact as an episode's turn (ratio {tokens / plain:.3f}); captures listed {len(stored['data'])}"
        f"{'+' if stored['has_more'] else ''}, episodes listed {len(recorded['data'])}"
        f"{'+' if recorded['has_more'] else ''}, dropped {dropped}"
    )


def _ready(api_url: str) -> bool:
    try:
        return httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
