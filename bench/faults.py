"""Fault trials for fine-tuning jobs: SIGKILL the worker in the middle of a job, N times.

Each trial creates an SFT job on `tiny-glm-moe`, waits until it has run a seeded-random
number of steps, kills its worker with SIGKILL, starts a fresh worker, and waits for the
job to finish. It prints, per trial, where the kill landed, which checkpoint the job
resumed from, the steps redone, and whether the final adapter has exactly the requested
number of optimizer steps; then how many jobs were lost and how many steps were redone.

Before the trials it measures job latencies on a warm worker: create -> running, and
step -> its metrics event visible through the API.

    .venv/bin/python bench/faults.py                 # embedded defaults in a temporary MINT_HOME
    MINT_DATABASE_URL=postgresql://... MINT_BROKER_URL=redis://... .venv/bin/python bench/faults.py

Leases are short (3 s) and the reconciler runs every second, as an operator would set them
for a fast failover; the defaults (120 s, 30 s) trade failover time for fewer writes.

The bench is a client like any other: it calls the API through the SDK (`mint.sdk.Mint` over
the in-process app), under the per-key rate limit (`MINT_RATE_LIMIT`, 1,200 a minute), whose
429s the SDK waits out as their Retry-After says. It polls every 50 ms where the poll is the
measurement (the latencies, whose resolution that is, and the kill point), every 0.5 s where
it only waits for an end; the number of 429s met is printed at the end.

    .venv/bin/python bench/faults.py --trials 3      # a short run: about 1.5 minutes here (10: about 4)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE = "tiny-glm-moe"
FAST = {"MINT_JOB_LEASE_S": "3", "MINT_RECONCILE_EVERY_S": "1", "MINT_REQUEUE_GRACE_S": "2", "HF_HUB_OFFLINE": "1"}
# Polls where the poll is the measurement: 20 a second, within the key's 1,200 a minute.
MEASURE_POLL_S = 0.05
# Polls that only wait for something to end.
WAIT_POLL_S = 0.5


class RateLimitTally(logging.Handler):
    """Counts the 429s the SDK waited out (it logs each on `mint.sdk`), and the seconds it waited."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.refused = 0
        self.waited_s = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        waited = re.search(r"HTTP 429.*waiting ([0-9.]+)s", record.getMessage())
        if waited:
            self.refused += 1
            self.waited_s += float(waited.group(1))


def wait_for(condition: Any, what: str, timeout: float = 300.0, every: float = WAIT_POLL_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"gave up waiting for {what}")


class Platform:
    """The API in-process, and worker and beat subprocesses, on one set of settings."""

    def __init__(self) -> None:
        from fastapi.testclient import TestClient

        from mint.api.app import create_app
        from mint.config import get_settings
        from mint.sdk import Mint
        from mint.services import auth
        from mint.services.setup import prepare_database
        from mint.storage.db import session_scope
        from mint.worker.dispatch import CeleryDispatch

        get_settings.cache_clear()
        self.settings = get_settings()
        prepare_database(self.settings)
        with session_scope(self.settings.database) as session:
            org = auth.create_organization(session, name=f"faults-{os.getpid()}-{int(time.time())}")
            _key, secret = auth.create_api_key(session, auth.operator(org.id), name="bench", role="developer")
        app = create_app(self.settings, dispatch=CeleryDispatch(self.settings))
        self.sdk = Mint(api_key=secret, http_client=TestClient(app))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, **FAST}

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", *args],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        return process

    def worker(self, name: str) -> subprocess.Popen[bytes]:
        return self.spawn("worker", "--base", BASE, "--name", f"{name}@%h")

    def upload(self, rows: list[dict[str, Any]]) -> str:
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        return self.sdk.datasets.upload(body, filename="t.jsonl").id

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        fields = {name: value for name, value in body.items() if name not in ("model", "training_file")}
        return self.sdk.jobs.create(body["model"], body["training_file"], **fields).model_dump()

    def job(self, job_id: str) -> dict[str, Any]:
        return self.sdk.jobs.get(job_id).model_dump()

    def finished(self, job_id: str) -> dict[str, Any]:
        return self.sdk.jobs.wait(job_id, progress=False, poll_interval_s=WAIT_POLL_S).model_dump()

    def metrics_events(self, job_id: str) -> list[dict[str, Any]]:
        page = self.sdk.jobs.events(job_id, limit=100).first_page()
        return [event.model_dump() for event in page.data if event.type == "metrics"]

    def version_metrics(self, model_ref: str) -> dict[str, Any]:
        return dict(self.sdk.adapters.resolve(model_ref).metrics)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def rows(n: int) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": f"OK {i % 3}"}]}
        for i in range(n)
    ]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def create_to_running(platform: Platform, file_id: str, jobs: int = 5) -> dict[str, float]:
    """On a warm worker: the time from the create request to the job running (seconds)."""
    platform.finished(platform.create({"model": BASE, "training_file": file_id, "steps": 1})["id"])  # warm-up
    starts = []
    for _ in range(jobs):
        begun = time.monotonic()
        job = platform.create({"model": BASE, "training_file": file_id, "steps": 1})
        wait_for(lambda job=job: platform.job(job["id"])["status"] != "queued", "running", every=MEASURE_POLL_S)
        starts.append(time.monotonic() - begun)
        platform.finished(job["id"])
    return {"create_to_running_median_s": statistics.median(starts), "create_to_running_max_s": max(starts)}


def event_visibility(platform: Platform, file_id: str, steps: int) -> dict[str, float]:
    """Step finished (its event's commit time, from the database) -> the event seen by a poller."""
    from sqlalchemy import select

    from mint.storage.db import session_scope
    from mint.storage.tables import JobEvent, as_utc

    job = platform.create({"model": BASE, "training_file": file_id, "steps": steps, "checkpoint_interval": steps})
    seen: dict[int, float] = {}
    while len(seen) < steps:
        events = platform.metrics_events(job["id"])
        now = time.time()  # when the poll's answer arrived (a 429 waited out inside it counts)
        for event in events:
            seen.setdefault(int(event["id"]), now)
        time.sleep(MEASURE_POLL_S)
    platform.finished(job["id"])
    with session_scope(platform.settings.database) as session:
        created = {
            event.id: as_utc(event.created_at).timestamp()
            for event in session.execute(select(JobEvent).where(JobEvent.job_id == job["id"])).scalars()
        }
    delays = [seen[event_id] - created[event_id] for event_id in seen]
    return {"step_to_event_median_s": statistics.median(delays), "step_to_event_p95_s": percentile(delays, 0.95)}


def trial(platform: Platform, file_id: str, number: int, steps: int, interval: int, kill_at: int) -> dict[str, Any]:
    victim = platform.worker(f"victim{number}")
    body = {"model": BASE, "training_file": file_id, "seed": number, "steps": steps, "checkpoint_interval": interval}
    job = platform.create({**body, "suffix": f"trial-{number}"})
    wait_for(lambda: platform.job(job["id"])["completed_steps"] >= kill_at, "the kill point", every=MEASURE_POLL_S)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = platform.job(job["id"])["completed_steps"]
    killed = time.monotonic()
    rescuer = platform.worker(f"rescuer{number}")
    final = platform.finished(job["id"])
    recovered_s = time.monotonic() - killed
    rescuer.send_signal(signal.SIGTERM)
    rescuer.wait()
    optimizer_steps = (
        platform.version_metrics(final["fine_tuned_model"])["optimizer_steps"] if final["fine_tuned_model"] else None
    )
    return {
        "trial": number,
        "killed_at_step": killed_at,
        "resumed_from": killed_at - final["steps_redone"],
        "steps_redone": final["steps_redone"],
        "status": final["status"],
        "attempts": final["attempts"],
        "optimizer_steps": optimizer_steps,
        "recovery_s": round(recovered_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--checkpoint-interval", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if "MINT_HOME" not in os.environ:
        os.environ["MINT_HOME"] = tempfile.mkdtemp(prefix="mint-faults-")
    os.environ.update(FAST)
    platform = Platform()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    refusals = RateLimitTally()
    sdk_log = logging.getLogger("mint.sdk")
    sdk_log.setLevel(logging.INFO)
    sdk_log.addHandler(refusals)
    sdk_log.propagate = False
    print(f"database {platform.settings.database.split('://')[0]}, broker {platform.settings.broker.split('://')[0]}")
    rng = random.Random(args.seed)
    try:
        file_id = platform.upload(rows(12))
        platform.spawn("beat")  # runs the reconciler every second
        warm = platform.worker("warm")
        latencies = create_to_running(platform, file_id) | event_visibility(platform, file_id, steps=8)
        warm.send_signal(signal.SIGTERM)
        warm.wait()
        print("\nlatencies on a warm worker")
        for name, value in latencies.items():
            print(f"  {name:28s} {value * 1000:8.1f} ms")
        results = []
        columns = ("trial", "killed at", "resumed", "redone", "status", "attempts", "steps", "recovery")
        header = " ".join(f"{name:>9}" for name in columns)
        print("\n" + header)
        for number in range(1, args.trials + 1):
            kill_at = rng.randint(2, args.steps - 2)
            result = trial(platform, file_id, number, args.steps, args.checkpoint_interval, kill_at)
            results.append(result)
            cells = [result[key] for key in ("trial", "killed_at_step", "resumed_from", "steps_redone", "status")]
            cells += [result["attempts"], result["optimizer_steps"], f"{result['recovery_s']}s"]
            print(" ".join(f"{cell!s:>9}" for cell in cells))
        lost = sum(1 for r in results if r["status"] != "succeeded")
        wrong = sum(1 for r in results if r["optimizer_steps"] != args.steps)
        redone = sum(r["steps_redone"] for r in results)
        print(
            f"\njobs lost: {lost} of {len(results)}; final adapters with other than {args.steps} optimizer steps: "
            f"{wrong}; steps redone: {redone} of {args.trials * args.steps} "
            f"(at most {args.checkpoint_interval} per kill with a checkpoint every {args.checkpoint_interval}: "
            "a kill can land after a step and before its checkpoint is written)"
        )
        print(
            f"429s met (rate limit {platform.settings.rate_limit or 'off'} per key): {refusals.refused}, "
            f"waited out as asked: {refusals.waited_s:.1f} s"
        )
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
