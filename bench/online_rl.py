"""Learning where the agent runs: the example harness (examples/agent_harness) sends live traffic
to a deployment of a warm-started SmolLM2 while an online RL job trains from its rewarded
episodes and the deployment serves each new version; the held-out split of the same task family
(tasks the harness never sent) measures the served version against the one it started from,
per task with a paired bootstrap interval (`/v1/evals/compare`).

The platform runs as in production on the embedded defaults in a temporary MINT_HOME: `mint api`,
`mint serve --base smollm2-135m-instruct` and `mint worker --base smollm2-135m-instruct` as
subprocesses. The round, as examples/agent_harness/README.md tells it:
  1. SFT warm start on the task family's warm-up demonstrations (`--sft-steps`);
  2. the warm start evaluated on the held-out benchmark, deployed, token capture on;
  3. an online RL job (`--steps` steps of `--batch` episodes, a version published and served
     every `--publish-every` steps) while the harness runs (`--concurrency` episodes at a time);
  4. the job's result (what the deployment serves at the end) evaluated on the same benchmark
     version, and compared with the warm start.

It prints what a team would ask of the loop: episodes per minute (the harness's), training
steps per minute (the job's), the time from an episode's reward to a served version trained on
it (per published version: its promotion's time minus the newest reward among the episodes its
step shows), failed requests across the switches (goal: 0), and the held-out comparison.

    .venv/bin/python bench/online_rl.py [--sft-steps 6] [--steps 8] [--batch 8] [--concurrency 2] [--held-out 20]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "agent_harness"))

from serve_load import _ready, free_port, wait_for  # noqa: E402

BASE = "smollm2-135m-instruct"


def _start(env: dict[str, str], *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "mint", *argv], env=env, stdout=subprocess.DEVNULL)


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _when(value: Any) -> float:
    """A time of the API (unix seconds, or an ISO timestamp) as unix seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-steps", type=int, default=6, help="Steps of the SFT warm start (batch 8, lr 1e-3).")
    parser.add_argument("--steps", type=int, default=8, help="Steps of the online RL job.")
    parser.add_argument("--batch", type=int, default=8, help="Rewarded episodes per online step.")
    parser.add_argument("--publish-every", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="The online job's (RL's default).")
    parser.add_argument("--concurrency", type=int, default=2, help="Harness episodes at a time.")
    parser.add_argument("--max-tokens", type=int, default=48, help="Longest turn the harness asks for.")
    parser.add_argument("--seed", type=int, default=0, help="Which tasks are drawn.")
    parser.add_argument(
        "--held-out", type=int, default=20, help="Tasks in the held-out benchmark (more narrow the interval)."
    )
    args = parser.parse_args()
    if "MINT_HOME" not in os.environ:
        os.environ["MINT_HOME"] = tempfile.mkdtemp(prefix="mint-online-rl-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    api_port = free_port()
    os.environ["MINT_API_PORT"] = str(api_port)

    import agent as harness
    import tasks as order_desk
    from openai import OpenAI

    from mint.config import get_settings
    from mint.sdk import Mint
    from mint.services.setup import initialize

    settings = get_settings()
    result = initialize(settings, organization_name="online")
    assert result.admin_key is not None, "MINT_HOME is already initialized; use a fresh one"
    env = os.environ.copy()
    processes = [_start(env, "api"), _start(env, "serve", "--base", BASE), _start(env, "worker", "--base", BASE)]
    api_url = f"http://127.0.0.1:{api_port}"
    try:
        wait_for(lambda: _ready(api_url), "the API")
        mint = Mint(base_url=api_url, api_key=result.admin_key)
        http = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {result.admin_key}"}, timeout=120)
        files = order_desk.write_all(
            Path(os.environ["MINT_HOME"]) / "order-desk", args.seed, {"held_out": args.held_out}
        )
        benchmark = mint.benchmarks.create("order-desk", path=files["benchmark"])
        dataset = mint.datasets.upload(files["sft"], kind="chat")
        warm = mint.jobs.create(
            BASE,
            dataset.id,
            steps=args.sft_steps,
            hyperparameters={"batch_size": 8},
            learning_rate=1e-3,
            suffix="order-desk",
        ).wait(progress=False)
        assert warm.status == "succeeded", warm
        start = warm.fine_tuned_model
        assert start is not None
        before = mint.evals.run(benchmark.id, start, progress=False, temperature=0.0)
        print(f"warm start {start} ({args.sft_steps} SFT steps): held-out {before.metrics}")
        mint.deployments.create("order-desk-prod", model=start)
        http.patch("/v1/deployments/order-desk-prod/capture", json={"rate": 1.0, "tokens": True}).raise_for_status()
        job = mint.jobs.create(
            BASE,
            method={
                "type": "online_rl",
                "online_rl": {
                    "deployment": "order-desk-prod",
                    "hyperparameters": {
                        "batch_size": args.batch,
                        "publish_every": args.publish_every,
                        "max_steps_off_policy": max(1, args.publish_every),
                        "max_wait_s": 900,
                    },
                },
            },
            steps=args.steps,
            learning_rate=args.learning_rate,
        )
        client = OpenAI(base_url=f"{api_url}/v1", api_key=result.admin_key, max_retries=0)
        train = order_desk.load_split("train", args.seed)
        stop = threading.Event()
        summaries: list[Any] = []

        def traffic() -> None:
            round_number = 0
            while not stop.is_set():
                summaries.append(
                    harness.run(
                        client,
                        "order-desk-prod",
                        train,
                        args.concurrency * 4,
                        seed=args.seed * 1000 + round_number,
                        concurrency=args.concurrency,
                        max_tokens=args.max_tokens,
                    )
                )
                round_number += 1

        thread = threading.Thread(target=traffic, daemon=True)
        started = time.monotonic()
        thread.start()
        finished = mint.jobs.wait(job.id, progress=False, timeout_s=7200)
        stop.set()
        thread.join(timeout=600)
        wall = time.monotonic() - started
        assert finished.status == "succeeded", finished
        end = finished.fine_tuned_model
        assert end is not None
        after = mint.evals.run(benchmark.id, end, progress=False, temperature=0.0)
        compared = mint.evals.compare(before.id, after.id, resamples=2000, seed=0)

        episodes = sum(summary.completed for summary in summaries)
        requests = sum(summary.requests for summary in summaries)
        failed = sum(summary.failed_requests for summary in summaries)
        events = list(mint.jobs.events(job.id, limit=100))
        metrics = sorted((event for event in events if event.type == "metrics"), key=lambda event: event.data["step"])
        published = [event for event in events if event.data.get("served")]
        job_s = _when(finished.finished_at) - _when(finished.started_at or finished.created_at)
        lags = []
        for event in published:
            step = next((m for m in metrics if m.data["step"] == event.data["step"]), None)
            shown = (step.data.get("samples") or []) if step is not None else []
            keys = [sample["text"].removeprefix("episode ") for sample in shown]
            rewarded = [_when(http.get(f"/v1/episodes/{key}").json()["rewarded_at"]) for key in keys]
            if rewarded:
                lags.append(_when(event.created_at) - max(rewarded))
        rewards = [m.data.get("reward", float("nan")) for m in metrics]
        print(
            f"online: {args.steps} steps of {args.batch} episodes in {job_s:.0f} s "
            f"({args.steps / job_s * 60:.2f} steps/min); {len(published)} versions served along the way, "
            f"then {end}"
        )
        print(
            f"harness: {episodes} episodes in {wall:.0f} s ({episodes / wall * 60:.1f} episodes/min), "
            f"{failed} failed requests of {requests}"
        )
        print("reward per step: " + ", ".join(f"{reward:.2f}" for reward in rewards))
        if lags:
            print(
                f"reward to served version: median {statistics.median(lags):.1f} s "
                f"(min {min(lags):.1f}, max {max(lags):.1f}) over {len(lags)} versions"
            )
        a, b, interval = compared.a, compared.b, compared.interval
        print(
            f"held-out ({compared.tasks} tasks): {start} accuracy {a.accuracy:.3f} (mean score {a.mean_score:.3f}) -> "
            f"{end} {b.accuracy:.3f} ({b.mean_score:.3f}); accuracy delta {compared.accuracy_delta:+.3f}, "
            f"{interval.confidence:.0%} paired bootstrap interval [{interval.low:+.3f}, {interval.high:+.3f}]"
            f"{', significant' if compared.significant else ', not significant'}; fixed {len(compared.fixed)}, "
            f"broken {len(compared.broken)}"
        )
    finally:
        _stop(processes)


if __name__ == "__main__":
    main()
