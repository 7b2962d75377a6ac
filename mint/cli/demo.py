"""`mint demo`: the whole loop on this machine, on the embedded defaults, with SmolLM2-135M.

It starts the platform (`mint up`: API, worker, beat, a serving node), then, through the
REST API only, as a team would:

1. imports the built-in `format` benchmark (train and held-out splits);
2. evaluates the base on both splits, keeping every trajectory;
3. mines the failures of the train split into an SFT dataset;
4. fine-tunes a LoRA adapter on them;
5. evaluates the new version on the held-out split (tasks it never trained on);
6. prints the per-task before/after table and the accuracy change with its paired
   bootstrap confidence interval;
7. deploys the version and answers one chat request through it;
8. leaves the platform and its dashboard up until Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from mint.cli.output import console
from mint.config import get_settings
from mint.schemas.evals import MAX_BUILTIN_TASKS
from mint.sdk._http import Call, SyncHTTP
from mint.sdk.errors import MintAPIError

BASE = "smollm2-135m-instruct"
POLL_S = 1.0
PLAIN_EVERY_S = 30.0  # where output is no terminal: a progress line at least this often


def _json(response: httpx.Response) -> Any:
    return response.json()


class Demo:
    """The REST calls of the loop, with progress shown while each long step runs. They go
    through the SDK's transport, as every `mint` command's do: a 429 is waited out as its
    Retry-After says, a failure retried."""

    def __init__(self, api_url: str, key: str) -> None:
        self.http = SyncHTTP(api_url, key, timeout_s=120, max_retries=3)

    def call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        try:
            return self.http.send(Call(method, path, _json, params=params, json=json))
        except MintAPIError as error:
            console.print(f"[red]{method} {path} failed ({error.status_code}): {error.message}[/red]")
            raise typer.Exit(1) from error

    def wait(self, path: str, label: str, progress: Progress, *, total_of: str, done_of: str) -> dict[str, Any]:
        """Poll a job or an eval run until it finishes, advancing a progress bar; where output is
        no terminal (a file, a pipe: the bar shows nothing), a plain line at each step done and
        at least every `PLAIN_EVERY_S` (`progress_line`)."""
        bar = progress.add_task(label, total=None)
        plain = not console.is_terminal
        began, last_line, last_done = time.monotonic(), 0.0, -1
        while True:
            body = self.call("GET", path)
            total = body.get(total_of) or body.get("config", {}).get(total_of)
            done = body.get(done_of) or 0
            progress.update(bar, total=total, completed=done)
            now = time.monotonic()
            if plain and (done != last_done or now - last_line >= PLAIN_EVERY_S):
                loss = self.last_loss(path) if done and "fine_tuning" in path else None
                print(progress_line(label, body, done, total, loss, now - began), flush=True)
                last_line, last_done = now, done
            if body["status"] in ("succeeded", "failed", "cancelled"):
                progress.update(bar, completed=total or 1, total=total or 1)
                if body["status"] != "succeeded":
                    console.print(f"[red]{label}: {body['status']}: {body.get('error')}[/red]")
                    raise typer.Exit(1)
                return dict(body)
            time.sleep(POLL_S)

    def last_loss(self, path: str) -> float | None:
        """The loss of a job's newest step, from its metrics events (None if none yet)."""
        try:
            page = self.http.send(Call("GET", f"{path}/events", _json, params={"limit": 10}))
        except MintAPIError:
            return None
        for event in page.get("data", []):
            loss = (event.get("data") or {}).get("loss")
            if event.get("type") == "metrics" and isinstance(loss, int | float):
                return float(loss)
        return None

    def evaluate(self, benchmark_id: str, model: str, split: str, progress: Progress) -> dict[str, Any]:
        body = {"benchmark_id": benchmark_id, "model": model, "split": split, "max_tokens": 48}
        run = self.call("POST", "/v1/evals", json=body)
        return self.wait(
            f"/v1/evals/{run['id']}", f"eval {model} on {split}", progress, total_of="task_count", done_of="tasks_done"
        )


def _seconds(seconds: float) -> str:
    """`4m 10s`, `45s`."""
    minutes, secs = divmod(max(int(round(seconds)), 0), 60)
    return f"{minutes}m {secs}s" if minutes else f"{secs}s"


def progress_line(
    label: str, body: dict[str, Any], done: int, total: int | None, loss: float | None, waited_s: float
) -> str:
    """One plain line of progress: `fine-tune (SFT, LoRA): step 6/24, loss 1.234, 4m 10s elapsed,
    about 12m 30s left`. Elapsed and time left are the server's (`elapsed_s`, `eta_s`) where it
    gives them, else the time this demo has waited."""
    parts = [f"{label}: {body.get('status')}", f"{'step' if 'total_steps' in body else 'done'} {done}/{total or '?'}"]
    if loss is not None:
        parts.append(f"loss {loss:.4g}")
    elapsed = body.get("elapsed_s")
    parts.append(f"{_seconds(elapsed if isinstance(elapsed, int | float) else waited_s)} elapsed")
    eta = body.get("eta_s")
    if isinstance(eta, int | float):
        basis = "measured" if str(body.get("eta_basis") or "").startswith("measured") else "estimated"
        parts.append(f"about {_seconds(eta)} left ({basis})")
    return ", ".join(parts)


def _node_answers(api_url: str) -> bool:
    """Whether the serving node of the base is up (evals are batched through it once it is)."""
    key = (get_settings().home / "admin.key").read_text().strip()
    body = {"model": BASE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{api_url}/v1/chat/completions", json=body, headers=headers, timeout=60).status_code == 200


def _start_platform(api_url: str, log_path: Path) -> subprocess.Popen[bytes]:
    """`mint up` in the background, its logs in `log_path` so the progress bars stay readable."""
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "up", "--serve", BASE], env=os.environ.copy(), stdout=log, stderr=log
        )
    deadline = time.monotonic() + 300
    with console.status("starting the platform (API, worker, beat, serving node with SmolLM2) ..."):
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise typer.Exit(1)
            try:
                if httpx.get(f"{api_url}/readyz", timeout=2).status_code == 200 and _node_answers(api_url):
                    return process
            except httpx.HTTPError:
                pass
            time.sleep(1)
    process.terminate()
    raise typer.Exit(1)


def _table(comparison: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> Table:
    table = Table(title="held-out tasks: base -> fine-tuned")
    for column in ("task", "before", "after", "change"):
        table.add_column(column)
    outcome = {
        **dict.fromkeys(comparison["fixed"], ("fail", "pass", "[green]fixed[/green]")),
        **dict.fromkeys(comparison["broken"], ("pass", "fail", "[red]broken[/red]")),
        **dict.fromkeys(comparison["still_passing"], ("pass", "pass", "")),
        **dict.fromkeys(comparison["still_failing"], ("fail", "fail", "")),
    }
    for task in sorted(outcome):
        table.add_row(task, *outcome[task])
    interval = comparison["interval"]
    table.caption = (
        f"accuracy {before['metrics'].get('accuracy', 0):.2f} -> {after['metrics'].get('accuracy', 0):.2f}, "
        f"change {comparison['accuracy_delta']:+.2f} "
        f"({100 * interval['confidence']:.0f}% CI [{interval['low']:+.2f}, {interval['high']:+.2f}], "
        f"paired bootstrap, {interval['resamples']} resamples)"
    )
    return table


def demo(
    steps: Annotated[int, typer.Option(min=1, max=10_000, help="Optimizer steps of the fine-tuning job.")] = 24,
    tasks: Annotated[
        int, typer.Option(min=1, max=MAX_BUILTIN_TASKS, help="Tasks per split of the built-in benchmark.")
    ] = 24,
) -> None:
    """Run the loop end to end on SmolLM2-135M: eval, mine failures, fine-tune, re-eval, deploy, chat."""
    settings = get_settings()
    started = time.monotonic()
    settings.ensure_home()
    log_path = settings.home / "demo-platform.log"
    console.print(f"Platform logs: {log_path}")
    platform = _start_platform(settings.api_url, log_path)
    try:
        demo_ = Demo(settings.api_url, (settings.home / "admin.key").read_text().strip())
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console) as progress:
            name = f"demo-format-{int(time.time())}"
            benchmark = demo_.call("POST", "/v1/benchmarks", json={"name": name, "builtin": "format", "n": tasks})
            mining = demo_.evaluate(benchmark["id"], BASE, "train", progress)
            before = demo_.evaluate(benchmark["id"], BASE, "heldout", progress)
            dataset = demo_.call("POST", "/v1/datasets/from-failures", json={"eval_id": mining["id"], "kind": "chat"})
            job = demo_.call(
                "POST",
                "/v1/fine_tuning/jobs",
                json={
                    "model": BASE,
                    "training_file": dataset["id"],
                    "suffix": "demo-format",
                    "seed": 0,
                    "steps": steps,
                    "learning_rate": 4e-4,
                    "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 8}}},
                },
            )
            trained = demo_.wait(
                f"/v1/fine_tuning/jobs/{job['id']}",
                "fine-tune (SFT, LoRA)",
                progress,
                total_of="total_steps",
                done_of="completed_steps",
            )
            after = demo_.evaluate(benchmark["id"], trained["fine_tuned_model"], "heldout", progress)
        comparison = demo_.call("GET", "/v1/evals/compare", params={"a": before["id"], "b": after["id"]})
        console.print(_table(comparison, before, after))
        deployment = f"demo-{int(time.time())}"
        demo_.call("POST", "/v1/deployments", json={"name": deployment, "model": trained["fine_tuned_model"]})
        question = "What is the capital of France?"
        chat = demo_.call(
            "POST",
            "/v1/chat/completions",
            json={
                "model": deployment,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 24,
                "temperature": 0,
            },
        )
        console.print(
            f"[bold]{question}[/bold] -> {chat['choices'][0]['message']['content']!r} "
            f"(served by {chat['mint']['adapter']} through deployment {deployment!r})"
        )
        console.print(
            f"The loop took {time.monotonic() - started:.0f} s. Dashboard: {settings.api_url}/ui "
            f"(sign in with the key in {settings.home / 'admin.key'}). Ctrl-C stops Mint."
        )
        platform.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if platform.poll() is None:
            platform.send_signal(signal.SIGTERM)
            platform.wait(timeout=60)
