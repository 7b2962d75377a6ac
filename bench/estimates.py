"""How good are Mint's job estimates? Runs a few real jobs on one `tiny-glm-moe` worker (SFT on
files of short and long rows, several step counts and batch sizes; with `--all`, DPO and RL too)
and prints, per job, the estimate made at create beside what the job took and cost, whether its
range held the outcome, and the job's self-calibrated figure (`elapsed_s + eta_s` read as soon
as its first step finished, from its own measured step time). Then the mean absolute error of
the jobs estimated before any job of their method had finished (the heuristic alone), of those
estimated after (the calibrated cost model), and of the self-calibrated figures.

    .venv/bin/python bench/estimates.py                 # embedded defaults in a temporary MINT_HOME
    .venv/bin/python bench/estimates.py --all           # DPO and RL jobs too
    MINT_DATABASE_URL=postgresql://... MINT_BROKER_URL=redis://... .venv/bin/python bench/estimates.py

Time counts from the claim to the end of the job (loading, training, saving) on this machine's
worker; the first job of the run also pays for loading the base.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.faults import Platform  # noqa: E402

POLL_S = 0.25  # how often a running job is read for its first measured ETA

logging.basicConfig(level=logging.WARNING)
logging.getLogger("httpx2").setLevel(logging.WARNING)


def short_rows(n: int) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": f"Ping {i}"}, {"role": "assistant", "content": f"OK {i % 3}"}]}
        for i in range(n)
    ]


def long_rows(n: int) -> list[dict[str, Any]]:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    return [
        {
            "messages": [
                {"role": "user", "content": "Summarize: " + " ".join(words[(i + j) % len(words)] for j in range(60))},
                {"role": "assistant", "content": " ".join(words[(i * 3 + j) % len(words)] for j in range(25))},
            ]
        }
        for i in range(n)
    ]


def preference_rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "input": {"messages": [{"role": "user", "content": f"Say yes {i}"}]},
            "preferred_output": [{"role": "assistant", "content": "yes"}],
            "non_preferred_output": [{"role": "assistant", "content": "no"}],
        }
        for i in range(n)
    ]


def prompt_rows(n: int) -> list[dict[str, Any]]:
    return [{"messages": [{"role": "user", "content": f"Say a {i}"}], "reference": "a"} for i in range(n)]


def plan(files: dict[str, str], everything: bool) -> list[tuple[str, dict[str, Any]]]:
    """(label, create body) of each job, in the order they run."""
    sft = {"type": "supervised"}
    rl = {"type": "reinforcement", "reinforcement": {"grader": {"type": "exact"},
          "hyperparameters": {"group_size": 4, "max_tokens": 8, "max_steps_without_signal": 100}}}  # fmt: skip
    dpo = {"type": "dpo"}
    sft_b4 = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}}
    jobs = [
        ("sft short 8 steps", {"training_file": files["short"], "steps": 8, "method": sft}),
        ("sft short 16 steps", {"training_file": files["short"], "steps": 16, "method": sft}),
        ("sft long 8 steps", {"training_file": files["long"], "steps": 8, "method": sft}),
        ("sft long 12 steps b4", {"training_file": files["long"], "steps": 12, "method": sft_b4}),
        ("sft short 24 steps", {"training_file": files["short"], "steps": 24, "method": sft}),
        ("dpo 6 steps", {"training_file": files["pairs"], "steps": 6, "method": dpo}),
        ("dpo 12 steps", {"training_file": files["pairs"], "steps": 12, "method": dpo}),
        ("rl 3 steps", {"training_file": files["prompts"], "steps": 3, "method": rl}),
        ("rl 6 steps", {"training_file": files["prompts"], "steps": 6, "method": rl}),
        ("sft long 16 steps", {"training_file": files["long"], "steps": 16, "method": sft}),
    ]  # fmt: skip
    return jobs if everything else [(label, body) for label, body in jobs if label.startswith("sft")]


def error(estimated: float, actual: float) -> float:
    return (estimated - actual) / actual if actual else 0.0


def run(platform: Platform, body: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """Run one job to its end; (the job, its self-calibrated length: `elapsed_s + eta_s` as first
    read once a step finished, or None if it finished before a read saw one)."""
    job_id = platform.create({"model": "tiny-glm-moe", **body})["id"]
    measured: float | None = None
    while True:
        job = platform.job(job_id)
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job, measured
        if measured is None and job["completed_steps"] >= 1 and job["eta_s"] is not None:
            measured = job["elapsed_s"] + job["eta_s"]
        time.sleep(POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="DPO and RL jobs too, not only SFT")
    args = parser.parse_args()
    if "MINT_HOME" not in os.environ:
        os.environ["MINT_HOME"] = tempfile.mkdtemp(prefix="mint-estimates-")
    platform = Platform()
    platform.worker("estimates")
    try:
        files = {
            "short": platform.upload(short_rows(16)),
            "long": platform.upload(long_rows(16)),
            "pairs": platform.upload(preference_rows(8)),
            "prompts": platform.upload(prompt_rows(4)),
        }
        # (calibrated_on, cost error, time error, actual in range, self-calibrated error or None)
        results: list[tuple[int, float, float, bool, float | None]] = []
        print(f"{'job':<22} {'calib.':>6} {'est. $':>10} {'actual $':>10} {'err':>7} ", end="")
        print(f"{'est. s':>7} {'range s':>14} {'actual s':>8} {'err':>7} {'self s':>7} {'err':>7}")
        for label, body in plan(files, args.all):
            job, measured = run(platform, body)
            if job["status"] != "succeeded":
                raise SystemExit(f"{label}: job {job['id']} {job['status']}: {job['error']}")
            estimate = job["estimate"]
            seconds = job["finished_at"] - job["started_at"]
            cost_error = error(estimate["cost_usd"], job["cost_usd"])
            time_error = error(estimate["seconds"], seconds)
            held = estimate["seconds_low"] <= seconds <= estimate["seconds_high"]
            self_error = None if measured is None else error(measured, seconds)
            results.append((estimate["calibrated_on"], cost_error, time_error, held, self_error))
            span = f"{estimate['seconds_low']:.1f}-{estimate['seconds_high']:.1f}"
            shown = "-" if measured is None else f"{measured:.1f}"
            print(
                f"{label:<22} {estimate['calibrated_on']:>6} {estimate['cost_usd']:>10.6f} {job['cost_usd']:>10.6f} "
                f"{cost_error:>+7.1%} {estimate['seconds']:>7.1f} {span:>14} {seconds:>8.1f} {time_error:>+7.1%} "
                f"{shown:>7} {'-' if self_error is None else f'{self_error:+.1%}':>7}"
            )
        for name, group in (
            ("heuristic alone", [r for r in results if r[0] == 0]),
            ("calibrated", [r for r in results if r[0] > 0]),
        ):
            if group:
                cost = statistics.fmean(abs(r[1]) for r in group)
                seconds = statistics.fmean(abs(r[2]) for r in group)
                held = sum(r[3] for r in group)
                print(
                    f"{name}: {len(group)} jobs, mean absolute error {cost:.1%} in cost, {seconds:.1%} in time; "
                    f"range held {held} of {len(group)}"
                )
        measured_errors = [abs(r[4]) for r in results if r[4] is not None]
        if measured_errors:
            print(
                f"self-calibrated after the first step: {len(measured_errors)} jobs, "
                f"mean absolute error {statistics.fmean(measured_errors):.1%} in time"
            )
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
