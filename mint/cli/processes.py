"""`mint api | worker | beat | up`: the long-running processes of DESIGN.md section 2."""

from __future__ import annotations

import enum
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.markup import escape

from mint.cli.output import console, errors
from mint.cli.supervisor import ChildKeepsDying, ChildSpec, Supervisor
from mint.config import Settings, get_settings
from mint.sdk._http import API_URL_FILE, local_api_url
from mint.worker.queues import EVALS_QUEUE, SERVING_QUEUE, SYSTEM_QUEUE, training_queue

READY_WAIT_S = 120.0
SUPERVISE_EVERY_S = 0.5
ADMIN_KEY_FILE = "admin.key"


def api(
    host: Annotated[str | None, typer.Option(help="Bind address (MINT_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="Port (MINT_API_PORT).")] = None,
) -> None:
    """Run the HTTP API (uvicorn)."""
    import uvicorn

    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    settings = get_settings()
    # The address given here is the one the settings carry: download URLs are built from them.
    settings = settings.model_copy(
        update={"api_host": host or settings.api_host, "api_port": port or settings.api_port}
    )
    configure_pool(settings)
    uvicorn.run(
        create_app(settings, dispatch=CeleryDispatch(settings)),
        host=settings.api_host,
        port=settings.api_port,
        log_level=settings.log_level.lower(),
        access_log=False,  # the API writes one line per request itself, with its id (mint.api.request_log)
    )


def configure_pool(settings: Settings) -> None:
    """Size this process's database pool from the settings (`MINT_DATABASE_POOL_*`)."""
    from mint.storage import db

    db.configure_pool_from(settings)


def worker_queues(base: str | None, queues: str | None, all_bases: list[str]) -> list[str]:
    """Queues a worker consumes: its base's training queue, or an explicit list, plus `system`."""
    if queues:
        chosen = [name.strip() for name in queues.split(",") if name.strip()]
    elif base:
        if base not in all_bases:
            raise typer.BadParameter(f"unknown base {base!r}; known: {', '.join(all_bases)}", param_hint="--base")
        chosen = [training_queue(base)]
    else:
        chosen = [*(training_queue(name) for name in all_bases), EVALS_QUEUE, SERVING_QUEUE]
    return sorted({*chosen, SYSTEM_QUEUE})


def worker(
    base: Annotated[str | None, typer.Option(help="Base model to keep resident; consumes its training queue.")] = None,
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues, instead of --base.")] = None,
    name: Annotated[str | None, typer.Option(help="Worker name (Celery -n); default from the queues.")] = None,
    nproc: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Shard --base over this many processes (a torch.distributed group, FSDP2), launched by "
            "torchrun's elastic agent: one per GPU, or gloo ranks on CPU.",
        ),
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="With --nproc: times the agent restarts the whole group after a rank fails.")
    ] = 0,
    nnodes: Annotated[
        int,
        typer.Option(min=1, help="With --nproc: machines in the group, each running this command with --nproc ranks."),
    ] = 1,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(help="With --nnodes > 1: host:port where the machines meet (torchrun's c10d rendezvous)."),
    ] = None,
    loglevel: str = "INFO",
) -> None:
    """Run a Celery worker. One process, one task at a time: it holds one resident base."""
    from mint.schemas.base_models import enabled_base_names

    settings = get_settings()
    bases = enabled_base_names(settings.model_configs_dir)
    chosen = worker_queues(base, queues, bases)
    node = name or (f"train-{base}@%h" if base else "mint@%h")
    if nproc is not None:
        if not base or queues:
            raise typer.BadParameter("a worker group holds one base: give --base, not --queues", param_hint="--nproc")
        if nnodes > 1 and not rdzv_endpoint:
            raise typer.BadParameter(
                "a group on several machines needs --rdzv-endpoint host:port, the same on every machine",
                param_hint="--nnodes",
            )
        rendezvous = (
            ["--standalone"]
            if nnodes == 1
            else [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={base}"]
        )
        # This process becomes the elastic agent: it starts the ranks, and stops them all when one fails.
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                *rendezvous,
                f"--nproc-per-node={nproc}",
                f"--max-restarts={max_restarts}",
                "-m",
                "mint.worker.group",
                f"--base={base}",
                f"--queues={','.join(chosen)}",
                f"--name={node}",
                f"--loglevel={loglevel}",
            ],
        )
    from mint.worker.main import run_worker

    if not queues:
        # A queue of this process's own, so that Tinker models stay on the process that holds
        # them (mint.worker.tinker_tasks). An explicit --queues list is taken as it is.
        from mint.worker.queues import process_queue

        chosen.append(process_queue())
    run_worker(chosen, node, loglevel)


def beat(loglevel: str = "INFO") -> None:
    """Run Celery beat: periodic upkeep (pruning dead workers, reconciling lost messages)."""
    from mint.worker.app import celery_app

    celery_app().start(["beat", "--loglevel", loglevel])


class EngineChoice(enum.StrEnum):
    """The engines `mint serve --engine` takes (`mint.config.EngineKind`)."""

    auto = "auto"
    torch = "torch"
    vllm = "vllm"


def serve(
    base: Annotated[str, typer.Option(help="The base model this node serves, with its adapters.")],
    host: Annotated[
        str | None, typer.Option(help="Bind address (MINT_SERVING_HOST); only the API should reach it.")
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the node's internal API.")] = 8100,
    url: Annotated[str | None, typer.Option(help="URL the API uses to reach this node; from host and port.")] = None,
    engine: Annotated[
        EngineChoice | None,
        typer.Option(help="auto: vLLM where a CUDA GPU and vLLM are, else torch. MINT_SERVING_ENGINE if omitted."),
    ] = None,
) -> None:
    """Run a serving node: the base resident, the multi-LoRA engine and the adapter cache."""
    import uvicorn

    from mint.api.node_app import create_node_app
    from mint.schemas.base_models import enabled_base_names
    from mint.serving.hosting import NodeHost

    settings = get_settings()
    if engine is not None:
        settings = settings.model_copy(update={"serving_engine": engine.value})
    configure_pool(settings)
    bases = enabled_base_names(settings.model_configs_dir)
    if base not in bases:
        raise typer.BadParameter(f"unknown or disabled base {base!r}; enabled: {', '.join(bases)}", param_hint="--base")
    bind = host or settings.serving_host
    app = create_node_app(settings, NodeHost(settings, base), url or f"http://{bind}:{port}")
    uvicorn.run(app, host=bind, port=port, log_level=settings.log_level.lower(), access_log=False)


def serving_plan(named: list[str] | None, nodes_per_base: int, enabled: list[str]) -> Counter[str]:
    """How many serving nodes `mint up` runs of each base: a base runs as many nodes as it is
    named in `--serve` (each value a comma-separated list) times `--nodes-per-base`; with no
    `--serve`, every enabled base is named once. An unknown or disabled base is refused."""
    chosen = enabled if named is None else [base.strip() for value in named for base in value.split(",")]
    counts: Counter[str] = Counter()
    for base in chosen:
        if not base:
            continue
        if base not in enabled:
            raise typer.BadParameter(
                f"unknown or disabled base {base!r}; enabled: {', '.join(enabled)}", param_hint="--serve"
            )
        counts[base] += nodes_per_base
    return counts


def serving_children(counts: Counter[str], api_port: int) -> list[ChildSpec]:
    """One `mint serve` child per node, on consecutive ports from `api_port + 100`; the nodes of
    a base that runs several are named `serve BASE #1`, `#2`, ... in the log."""
    children: list[ChildSpec] = []
    for base, count in counts.items():
        for number in range(1, count + 1):
            port = api_port + 100 + len(children)
            name = f"serve {base}" if count == 1 else f"serve {base} #{number}"
            children.append(ChildSpec(name, _mint_argv("serve", "--base", base, "--port", str(port))))
    return children


def up(
    org: Annotated[str, typer.Option("--org", help="First organization, on a new installation.")] = "default",
    serve_bases: Annotated[
        list[str] | None,
        typer.Option(
            "--serve",
            help="Bases to run serving nodes for, comma-separated or repeated (default: every enabled base); "
            "a base named twice runs two nodes, which share its requests and stand in for each other.",
        ),
    ] = None,
    nodes_per_base: Annotated[
        int, typer.Option(min=1, max=16, help="Serving nodes of each base named (or of every enabled base).")
    ] = 1,
) -> None:
    """Run the API, a worker for every queue (and one more for the system queue alone), beat, and
    serving nodes, on the current settings
    (the embedded defaults under MINT_HOME unless set otherwise). A child that dies is restarted
    with backoff; Ctrl-C or SIGTERM stops all, as does a child that keeps dying (exit status 1).
    Mint is up once the API is ready and every base served has a node that has loaded it."""
    from mint.schemas.base_models import enabled_base_names
    from mint.services.setup import initialize
    from mint.worker.app import declare_broker_queues

    settings = get_settings()
    counts = serving_plan(serve_bases, nodes_per_base, enabled_base_names(settings.model_configs_dir))
    result = initialize(settings, organization_name=org)
    declare_broker_queues(settings)  # before the workers and the API that share them start
    key_file = settings.home / ADMIN_KEY_FILE
    if result.admin_key is not None:
        _write_secret(key_file, result.admin_key)
    # Where the CLI and SDK find this API when nothing else names it (a shell without MINT_API_PORT).
    (settings.home / API_URL_FILE).write_text(local_api_url(settings.api_host, settings.api_port) + "\n")
    # SIGTERM (a service manager, `timeout`, `make` interrupted) stops the children too, and so
    # does SIGINT even where it was ignored (a shell script's background job inherits SIG_IGN).
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    nodes = serving_children(counts, settings.api_port)
    # The API's /readyz waits for every base served here: until each has a node that has
    # loaded it, requests for it would be refused (503).
    api_child = ChildSpec("api", _mint_argv("api"), env={"MINT_READY_BASES": ",".join(counts)})
    # A second worker for the system queue alone, holding no base: auto-mode drivers, webhook
    # deliveries and upkeep go on while the main worker spends minutes on one training job
    # (each worker runs one task at a time), so an auto run's cancel and cost keep up.
    system_worker = ChildSpec("system worker", _mint_argv("worker", "--queues", SYSTEM_QUEUE, "--name", "system@%h"))
    specs = [api_child] + [ChildSpec(name, _mint_argv(name)) for name in ("worker", "beat")] + [system_worker] + nodes
    supervisor = Supervisor(specs, spawn=_spawn, log=_log_restart)
    supervisor.start()
    try:
        _wait_ready(settings, supervisor, counts)
        console.print(
            f"[bold green]Mint is up[/bold green] at {settings.api_url}  (API reference: {settings.api_url}/docs)"
        )
        if key_file.exists():
            console.print(f"Admin API key of organization {result.organization_name!r}: {key_file}")
        console.print("Ctrl-C stops the API, the worker, beat and the serving nodes; a child that dies is restarted.")
        while True:
            supervisor.poll()
            time.sleep(SUPERVISE_EVERY_S)
    except ChildKeepsDying as error:
        errors.print(f"[red]mint up: {escape(str(error))} Stopping everything.[/red]")
        raise typer.Exit(1) from error
    except KeyboardInterrupt:
        pass
    finally:
        supervisor.stop()


def _raise_keyboard_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when `mint up` dies, even by
    SIGKILL, so that no orphaned API, worker or beat outlives it."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _mint_argv(*command: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "mint", *command)


def _spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(spec.argv), env={**os.environ, **spec.env}, preexec_fn=_die_with_parent)


def _log_restart(message: str) -> None:
    errors.print(f"[yellow]mint up: {escape(message)}[/yellow]")


def _readiness(settings: Settings) -> tuple[int, dict[str, Any]] | None:
    """The API's /readyz: its status code and body, or None while it does not answer."""
    try:
        response = httpx.get(f"{settings.api_url}/readyz", timeout=2.0)
        return response.status_code, dict(response.json())
    except (httpx.HTTPError, ValueError):
        return None


def _wait_ready(settings: Settings, supervisor: Supervisor, served: Counter[str]) -> None:
    """Wait for the API's /readyz, restarting children that die meanwhile, and print each base
    served as soon as a node has loaded it. The backing services must answer within
    READY_WAIT_S; loading the bases has no deadline (a large one takes minutes, and a node that
    keeps dying makes the supervisor give up)."""
    deadline: float | None = time.monotonic() + READY_WAIT_S
    can_serve: set[str] = set()
    with console.status("starting the API, a worker, beat and the serving nodes ...") as status:
        while True:
            supervisor.poll()
            answer = _readiness(settings)
            if answer is not None:
                code, body = answer
                for base, state in body.get("serving", {}).items():
                    if base in served and state.get("ready") and base not in can_serve:
                        can_serve.add(base)
                        nodes = state.get("live_nodes", 0)
                        console.print(f"{base} can serve: {nodes} of its {served[base]} serving node(s) loaded it")
                if code == 200:
                    return
                if not body.get("failed"):
                    deadline = None  # the services are up: the rest is loading bases
                    status.update(f"loading {', '.join(body.get('loading', []))} on the serving nodes ...")
            if deadline is not None and time.monotonic() > deadline:
                console.print(f"[red]The API was not ready within {READY_WAIT_S:.0f} s; see the logs above.[/red]")
                raise typer.Exit(1)
            time.sleep(0.5)


def _write_secret(path: Path, secret: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
