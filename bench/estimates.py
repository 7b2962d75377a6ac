"""How good are Mint's job estimates? Runs a sequence of real jobs on one `tiny-glm-moe` worker
(SFT on files of short and long rows, DPO, RL; several step counts and batch sizes) and prints,
per job, the estimate made at create beside what the job used and cost, then the mean absolute
error of the jobs estimated before any job of their method had finished (the heuristic alone)
and of those estimated after (the calibrated cost model).

    .venv/bin/python bench/estimates.py                 # embedded defaults in a temporary MINT_HOME
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.faults import Platform  # noqa: E402

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


def plan(files: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """(label, create body) of each job, in the order they run."""
    sft = {"type": "supervised"}
    rl = {"type": "reinforcement", "reinforcement": {"grader": {"type": "exact"},
          "hyperparameters": {"group_size": 4, "max_tokens": 8, "max_steps_without_signal": 100}}}  # fmt: skip
    dpo = {"type": "dpo"}
    sft_b4 = {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 4}}}
    return [
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


def error(estimated: float, actual: float) -> float:
    return (estimated - actual) / actual if actual else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
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
        results = []
        print(f"{'job':<22} {'calib.':>6} {'est. $':>10} {'actual $':>10} {'err':>7} ", end="")
        print(f"{'est. s':>7} {'actual s':>8} {'err':>7}")
        for label, body in plan(files):
            job = platform.finished(platform.create({"model": "tiny-glm-moe", **body})["id"])
            if job["status"] != "succeeded":
                raise SystemExit(f"{label}: job {job['id']} {job['status']}: {job['error']}")
            estimate = job["estimate"]
            seconds = job["finished_at"] - job["started_at"]
            cost_error = error(estimate["cost_usd"], job["cost_usd"])
            time_error = error(estimate["seconds"], seconds)
            results.append((estimate["calibrated_on"], cost_error, time_error))
            print(
                f"{label:<22} {estimate['calibrated_on']:>6} {estimate['cost_usd']:>10.6f} {job['cost_usd']:>10.6f} "
                f"{cost_error:>+7.1%} {estimate['seconds']:>7.1f} {seconds:>8.1f} {time_error:>+7.1%}"
            )
        for name, group in (
            ("heuristic alone", [r for r in results if r[0] == 0]),
            ("calibrated", [r for r in results if r[0] > 0]),
        ):
            if group:
                cost = statistics.fmean(abs(r[1]) for r in group)
                seconds = statistics.fmean(abs(r[2]) for r in group)
                print(f"{name}: {len(group)} jobs, mean absolute error {cost:.1%} in cost, {seconds:.1%} in time")
    finally:
        platform.stop()


if __name__ == "__main__":
    main()
