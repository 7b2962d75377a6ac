"""`mint admin ...`: operator commands. They act on the database directly, so they need
the same settings as the servers (MINT_DATABASE_URL or MINT_HOME), not an API key."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mint.cli.organization import KEY_COLUMNS
from mint.cli.output import console, emit, emit_one
from mint.cli.usage import COLUMNS as USAGE_COLUMNS
from mint.config import get_settings
from mint.errors import InvalidRequest, ServiceUnavailable

# The database layer (SQLAlchemy, alembic, the services) is imported inside the commands that use
# it: every `mint` command loads this module, and most never touch the database (a second saved
# on each start).
if TYPE_CHECKING:
    from mint.config import Settings
    from mint.services.serving.nodes import NodeAddress

admin = typer.Typer(
    help="Operator commands: set-up, organizations, keys, models, workers, queues, jobs, gc.", no_args_is_help=True
)
orgs = typer.Typer(help="Organizations (tenants).", no_args_is_help=True)
keys = typer.Typer(help="API keys of an organization.", no_args_is_help=True)
models = typer.Typer(help="Base models of the registry (configs/models).", no_args_is_help=True)
workers = typer.Typer(help="Live Celery workers.", no_args_is_help=True)
jobs = typer.Typer(help="Fine-tuning jobs of every organization: list, requeue, reconcile.", no_args_is_help=True)
cache = typer.Typer(help="The adapter caches of the serving nodes: statistics, pins, evictions.", no_args_is_help=True)
prices = typer.Typer(help="The price table: USD per million tokens, per base.", no_args_is_help=True)
admin.add_typer(prices, name="prices")
admin.add_typer(orgs, name="orgs")
admin.add_typer(jobs, name="jobs")
admin.add_typer(cache, name="cache")
admin.add_typer(keys, name="keys")
admin.add_typer(models, name="models")
admin.add_typer(workers, name="workers")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
OrgOpt = Annotated[str, typer.Option("--org", help="Organization name or id.")]


@contextmanager
def _database(settings: Settings | None = None) -> Iterator[Any]:
    """A SQLAlchemy session on the operator's database (MINT_DATABASE_URL or MINT_HOME) that
    commits on success: the commands' one way in, which loads the database layer when first used
    (typed Any, as `_price_rows` takes it: SQLAlchemy belongs to the storage and service layers)."""
    from mint.storage.db import session_scope

    with session_scope((settings or get_settings()).database) as session:
        yield session


def _key_row(key: Any) -> dict[str, Any]:
    return {column: getattr(key, column) for column in KEY_COLUMNS}


# Commands that work on an empty or unreachable database, or need none.
NEEDS_NO_SCHEMA = {"init", "migrate", "models"}


@admin.callback()
def require_schema(ctx: typer.Context) -> None:
    """Operator commands act on the database named by MINT_DATABASE_URL (or MINT_HOME)."""
    from mint.storage import migrate

    if ctx.invoked_subcommand not in NEEDS_NO_SCHEMA:
        migrate.require_schema(get_settings().database)


@admin.command("migrate")
def migrate_command() -> None:
    """Upgrade the database schema to the latest migration and sync the base registry."""
    from mint.services.setup import prepare_database
    from mint.storage import migrate

    settings = get_settings()
    bases = prepare_database(settings)
    console.print(f"database at revision {migrate.current_revision(settings.database)}; bases: {', '.join(bases)}")


@admin.command("init")
def init_command(
    org: Annotated[str, typer.Option("--org", help="Name of the first organization.")] = "default",
    as_json: JsonOpt = False,
) -> None:
    """Migrate, then create the first organization and its first admin key (printed once)."""
    from mint.services.setup import initialize

    result = initialize(get_settings(), organization_name=org)
    if as_json:
        emit_one(
            {
                "organization_id": result.organization_id,
                "organization": result.organization_name,
                "key": result.admin_key,
            },
            as_json=True,
        )
        return
    if result.admin_key is None:
        console.print(
            f"Already initialized (organization {result.organization_name!r}). "
            "Create more keys with `mint admin keys create --org NAME`."
        )
        return
    console.print(f"Organization [bold]{result.organization_name}[/bold] ({result.organization_id}) created.")
    console.print("Admin API key (shown once, store it now):")
    print(result.admin_key)


@orgs.command("create")
def orgs_create(name: str, as_json: JsonOpt = False) -> None:
    """Create an organization (then give it a key with `mint admin keys create`)."""
    from mint.services import auth

    with _database() as session:
        org = auth.create_organization(session, name=name)
        emit_one({"id": org.id, "name": org.name, "created_at": org.created_at}, as_json=as_json)


@orgs.command("list")
def orgs_list(as_json: JsonOpt = False) -> None:
    from mint.services import auth

    with _database() as session:
        rows = [{"id": o.id, "name": o.name, "created_at": o.created_at} for o in auth.list_organizations(session)]
    emit(rows, ["id", "name", "created_at"], as_json=as_json, title="organizations")


QUOTA_COLUMNS = ["kind", "used", "limit", "source"]
QUOTA_HELP = "{what}: a number from 0, or `default` for the platform's ({setting})."


def _quota_option(flag: str, what: str, setting: str) -> Any:
    return typer.Option(flag, metavar="N|default", help=QUOTA_HELP.format(what=what, setting=setting))


TinkerSessionsOpt = Annotated[
    str | None, _quota_option("--tinker-sessions", "Live Tinker sessions", "MINT_QUOTA_TINKER_SESSIONS")
]
TinkerModelsOpt = Annotated[
    str | None,
    _quota_option("--tinker-models", "Live Tinker training models (LoRA slots)", "MINT_QUOTA_TINKER_MODELS"),
]
JobsOpt = Annotated[str | None, _quota_option("--jobs", "Fine-tuning jobs queued or running", "MINT_QUOTA_JOBS")]
EvalRunsOpt = Annotated[str | None, _quota_option("--eval-runs", "Eval runs queued or running", "MINT_QUOTA_EVAL_RUNS")]
CaptureStorageOpt = Annotated[
    str | None,
    _quota_option(
        "--capture-storage-mib", "MiB of captured completions and feedback kept", "MINT_QUOTA_CAPTURE_STORAGE_MIB"
    ),
]


def _quota_value(option: str, value: str) -> int | None:
    """An option of `orgs quota`: a number, or `default` (None: the platform default)."""
    value = value.strip().lower()
    if value == "default":
        return None
    if not value.isdigit():
        raise InvalidRequest(f"{option} takes a number from 0 or `default`, not {value!r}.", param=option)
    return int(value)


@orgs.command("quota")
def orgs_quota(
    org: Annotated[str, typer.Argument(help="Organization name or id.")],
    tinker_sessions: TinkerSessionsOpt = None,
    tinker_models: TinkerModelsOpt = None,
    jobs: JobsOpt = None,
    eval_runs: EvalRunsOpt = None,
    capture_storage_mib: CaptureStorageOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show an organization's quotas and what is in use; with options, set them first (audited).

    Live Tinker sessions, live Tinker training models, fine-tuning jobs queued or running, eval
    runs queued or running: a create beyond a quota is answered 429. MiB of captured completions
    and their feedback kept: beyond it new captures are dropped and feedback is answered 429.
    """
    from mint.schemas.auth import QuotaKind
    from mint.services import auth
    from mint.services.billing.quotas import QuotaDefaults, quotas_of, set_quotas
    from mint.services.principal import operator

    given: dict[QuotaKind, str | None] = {
        "tinker_sessions": tinker_sessions,
        "tinker_models": tinker_models,
        "jobs": jobs,
        "eval_runs": eval_runs,
        "capture_storage_mib": capture_storage_mib,
    }
    changes = {
        kind: _quota_value("--" + kind.replace("_", "-"), value) for kind, value in given.items() if value is not None
    }
    settings = get_settings()
    with _database(settings) as session:
        organization = auth.find_organization(session, org)
        if changes:
            set_quotas(session, operator(organization.id), organization, changes)
        lines = quotas_of(session, organization, QuotaDefaults.of(settings))
    rows = [{**line.model_dump(), "source": "default" if line.is_default else "set"} for line in lines]
    if as_json:
        emit_one({"organization_id": organization.id, "organization": organization.name, "data": rows}, as_json=True)
        return
    emit(rows, QUOTA_COLUMNS, as_json=False, title=f"quotas of {organization.name}")


@keys.command("create")
def keys_create(
    org: OrgOpt,
    name: Annotated[str, typer.Option(help="A label, e.g. `ci`.")] = "cli",
    role: Annotated[str, typer.Option(help="admin | developer | viewer.")] = "developer",
    expires_in_days: Annotated[int | None, typer.Option(min=1, max=3650, help="Days until it expires.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a key; the secret is printed once (Mint stores only its hash)."""
    from mint.services import auth
    from mint.services.principal import operator

    with _database() as session:
        organization = auth.find_organization(session, org)
        key, secret = auth.create_api_key(
            session, operator(organization.id), name=name, role=role, expires_in_days=expires_in_days
        )
        row = {**_key_row(key), "organization": organization.name, "key": secret}
    if as_json:
        emit_one(row, as_json=True)
    else:
        console.print(f"Key {row['id']} ({role}) for {organization.name}; shown once:")
        print(secret)


@keys.command("list")
def keys_list(org: OrgOpt, as_json: JsonOpt = False) -> None:
    from mint.services import auth

    with _database() as session:
        organization = auth.find_organization(session, org)
        rows = [_key_row(key) for key in auth.all_api_keys(session, organization.id)]
    emit(rows, KEY_COLUMNS, as_json=as_json, title=f"keys of {org}")


@keys.command("revoke")
def keys_revoke(key_id: str, org: OrgOpt, as_json: JsonOpt = False) -> None:
    """Revoke a key at once."""
    from mint.services import auth
    from mint.services.principal import operator

    with _database() as session:
        organization = auth.find_organization(session, org)
        key = auth.revoke_api_key(session, operator(organization.id), key_id)
        emit_one(_key_row(key), as_json=as_json)


@models.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """Bases of the registry files."""
    from mint.schemas.base_models import load_registry

    specs = load_registry(get_settings().model_configs_dir)
    rows = [
        {"name": s.name, "architecture": s.architecture, "moe": s.moe, "enabled": s.enabled, "source": s.source.kind}
        for s in specs.values()
    ]
    emit(rows, ["name", "architecture", "moe", "enabled", "source"], as_json=as_json, title="base models")


@models.command("pull")
def models_pull(name: str) -> None:
    """Materialise a base's weights and tokenizer in the local cache (safetensors)."""
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.models import pull_base_model  # torch: only on machines with the train extra

    settings = get_settings()
    spec = get_base_model_spec(name, settings.model_configs_dir)
    with console.status(f"pulling {name} ..."):
        folder = pull_base_model(spec, settings.models_cache_dir)
    console.print(f"{name} ready at {folder}")


@workers.command("list")
def workers_list(as_json: JsonOpt = False) -> None:
    """Workers that registered and are still heartbeating."""
    from mint.services.workers import list_workers

    with _database() as session:
        rows = [
            {
                "id": w.id,
                "base_model": w.base_model,
                "queues": w.queues,
                "pid": w.pid,
                "started_at": w.started_at,
                "last_seen_at": w.last_seen_at,
            }
            for w in list_workers(session)
        ]
    emit(rows, ["id", "base_model", "queues", "pid", "started_at", "last_seen_at"], as_json=as_json, title="workers")


@admin.command("queues")
def queues_command(as_json: JsonOpt = False) -> None:
    """Messages waiting in each queue, and those taken by a worker but not yet acknowledged."""
    from mint.schemas.base_models import enabled_base_names
    from mint.storage.broker import queue_states
    from mint.worker.queues import all_queues

    settings = get_settings()
    names = all_queues(enabled_base_names(settings.model_configs_dir))
    states = queue_states(settings, names)
    if states is None:
        raise ServiceUnavailable(f"Mint cannot read queue depths on broker {settings.broker!r}", param="broker_url")
    rows = [
        {
            "queue": name,
            "waiting": states[name].waiting,
            "in_flight": len(states[name].task_ids) - states[name].waiting,
        }
        for name in names
    ]
    emit(rows, ["queue", "waiting", "in_flight"], as_json=as_json, title=f"queues on {settings.broker.split('://')[0]}")


JOB_COLUMNS = ["id", "organization_id", "base_model", "method", "status", "completed_steps", "total_steps", "attempts"]


@jobs.command("list")
def jobs_list(
    status: Annotated[str | None, typer.Option(help="Only jobs in this state, e.g. running.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The newest jobs of all organizations, with their progress and worker."""
    from mint.services.jobs.fine_tuning import list_all_jobs

    with _database() as session:
        rows = [
            {**{column: getattr(job, column) for column in JOB_COLUMNS}, "worker_id": job.worker_id}
            for job in list_all_jobs(session, status=status, limit=limit)
        ]
    emit(rows, [*JOB_COLUMNS, "worker_id"], as_json=as_json, title="fine-tuning jobs")


@jobs.command("requeue")
def jobs_requeue(job_id: str, as_json: JsonOpt = False) -> None:
    """Send a queued job again, or take a running one from its worker to resume from its last checkpoint."""
    from mint.services.upkeep.reconciler import requeue_job
    from mint.worker.dispatch import CeleryDispatch

    settings = get_settings()
    with _database(settings) as session:
        job = requeue_job(session, job_id, send=CeleryDispatch(settings))
        emit_one({"id": job.id, "status": job.status, "task_id": job.task_id}, as_json=as_json)


@jobs.command("reconcile")
def jobs_reconcile(as_json: JsonOpt = False) -> None:
    """Run the reconciler once now (beat runs it periodically)."""
    from mint.worker.dispatch import run_reconciler

    emit_one(run_reconciler(get_settings()).as_dict(), as_json=as_json)


CACHE_COLUMNS = ["node", "tier", "hits", "misses", "promotions", "evictions", "entries", "bytes", "promotion_ms"]


@cache.command("stats")
def cache_stats(
    base: Annotated[str | None, typer.Option(help="Only the nodes of this base.")] = None, as_json: JsonOpt = False
) -> None:
    """Per node and tier: hits, misses, promotions, evictions, what it holds, mean promotion time."""
    from mint.services.serving.node_client import call_node
    from mint.services.serving.nodes import live_addresses

    settings = get_settings()
    with _database(settings) as session:
        nodes = live_addresses(session, base, settings.shared_node_token)
    rows = []
    for node in nodes:
        stats = call_node(node, "GET", "/internal/v1/cache")
        for tier in stats["tiers"]:
            latency = tier["promotion_latency"]
            rows.append(
                {
                    "node": stats["node_id"],
                    "tier": tier["name"],
                    "hits": tier["hits"],
                    "misses": tier["misses"],
                    "promotions": tier["promotions"],
                    "evictions": tier["evictions"],
                    "entries": tier["resident_entries"],
                    "bytes": tier["resident_bytes"],
                    "promotion_ms": round(1000 * latency["sum_s"] / latency["count"], 2) if latency["count"] else None,
                }
            )
    emit(rows, CACHE_COLUMNS, as_json=as_json, title="adapter caches")


def _pin_target(model: str, org: str) -> tuple[NodeAddress, dict[str, Any]]:
    """The node that serves `model` (an adapter version of organization `org`) and the adapter's wire form."""
    from mint.services import auth
    from mint.services.serving.inference import plan_for
    from mint.services.serving.nodes import node_for

    settings = get_settings()
    with _database(settings) as session:
        organization = auth.find_organization(session, org)
        plan = plan_for(session, organization.id, model)
        if plan.adapter is None:
            raise InvalidRequest(f"{model!r} is not an adapter version; pin one such as name@1", param="model")
        node = node_for(session, plan.base_model, plan.affinity, settings.shared_node_token)
        return node, {"adapter": plan.adapter.model_dump()}


@cache.command("pin")
def cache_pin(model: str, org: OrgOpt, as_json: JsonOpt = False) -> None:
    """Keep an adapter version loaded on the node that serves it (never evicted until unpinned)."""
    from mint.services.serving.node_client import call_node

    node, body = _pin_target(model, org)
    emit_one({"node": node.id, **call_node(node, "POST", "/internal/v1/cache/pin", body)}, as_json=as_json)


@cache.command("unpin")
def cache_unpin(model: str, org: OrgOpt, as_json: JsonOpt = False) -> None:
    """Undo a pin; the adapter becomes evictable again."""
    from mint.services.serving.node_client import call_node

    node, body = _pin_target(model, org)
    emit_one({"node": node.id, **call_node(node, "POST", "/internal/v1/cache/unpin", body)}, as_json=as_json)


@cache.command("evict")
def cache_evict(
    model: str,
    org: OrgOpt,
    tier: Annotated[str | None, typer.Option(help="engine | cpu | ssd; every tier if omitted.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove an adapter version's cached copies (the object store keeps it); refused while in use or pinned."""
    from mint.services.serving.node_client import call_node

    node, body = _pin_target(model, org)
    evicted = call_node(node, "POST", "/internal/v1/cache/evict", {**body, "tier": tier})
    emit_one({"node": node.id, **evicted}, as_json=as_json)


PRICE_COLUMNS = ["base_model", "trained", "sampled", "served", "gpu_hour", "source"]


def _price_rows(session: Any) -> list[dict[str, Any]]:
    from dataclasses import asdict

    from mint.services.billing.prices import price_table

    return [
        {"base_model": base, **asdict(line), "source": "default" if is_default else "set"}
        for base, line, is_default in price_table(session)
    ]


@prices.command("list")
def prices_list(as_json: JsonOpt = False) -> None:
    """Every enabled base's prices: USD per million tokens trained, sampled, served; per GPU-hour."""
    with _database() as session:
        rows = _price_rows(session)
    emit(rows, PRICE_COLUMNS, as_json=as_json, title="prices (USD per million tokens; per GPU-hour)")


def _price_option(flag: str, what: str) -> Any:
    return typer.Option(flag, min=0.0, help=f"USD {what}.")


@prices.command("set")
def prices_set(
    base: Annotated[str, typer.Argument(help="The base model.")],
    trained: Annotated[float | None, _price_option("--trained", "per million tokens trained")] = None,
    sampled: Annotated[float | None, _price_option("--sampled", "per million tokens sampled (RL, evals)")] = None,
    served: Annotated[float | None, _price_option("--served", "per million tokens served")] = None,
    gpu_hour: Annotated[float | None, _price_option("--gpu-hour", "per GPU-hour of full-parameter training")] = None,
    default: Annotated[bool, typer.Option("--default", help="Drop the base's prices: the defaults apply.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Set a base's prices (the others keep theirs), audited. Usage recorded from now on is priced
    at them; what was recorded before keeps its price."""
    from mint.services.billing.prices import PRICE_FIELDS, set_prices

    given = {"trained": trained, "sampled": sampled, "served": served, "gpu_hour": gpu_hour}
    changes: dict[str, float | None] = (
        dict.fromkeys(PRICE_FIELDS) if default else {k: v for k, v in given.items() if v is not None}
    )
    if not changes:
        raise InvalidRequest("give at least one of --trained, --sampled, --served, --gpu-hour, or --default")
    with _database() as session:
        set_prices(session, base, changes)
        rows = [row for row in _price_rows(session) if row["base_model"] == base]
    emit(rows, PRICE_COLUMNS, as_json=as_json, title=f"prices of {base}")


ESTIMATE_COLUMNS = ["job_id", "base_model", "method", "calibrated_on", "estimated_usd", "actual_usd", "cost_error",
                    "estimated_seconds", "actual_seconds", "seconds_error"]  # fmt: skip


@admin.command("estimates")
def estimates_command(
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="The newest jobs to compare.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """How far the cost model's estimates were from what finished jobs cost and took, newest
    first, with the mean absolute error: the figures to judge the model by."""
    from mint.services.billing.prices import estimate_errors

    with _database() as session:
        errors = estimate_errors(session, limit=limit)
    rows = [
        {
            "job_id": e.job_id,
            "base_model": e.base_model,
            "method": e.method,
            "calibrated_on": e.calibrated_on,
            "estimated_usd": round(e.estimated_usd, 6),
            "actual_usd": round(e.actual_usd, 6),
            "cost_error": f"{e.cost_error:+.1%}",
            "estimated_seconds": round(e.estimated_seconds, 1),
            "actual_seconds": round(e.actual_seconds, 1),
            "seconds_error": f"{e.seconds_error:+.1%}",
        }
        for e in errors
    ]
    cost = sum(abs(e.cost_error) for e in errors) / len(errors) if errors else 0.0
    seconds = sum(abs(e.seconds_error) for e in errors) / len(errors) if errors else 0.0
    title = f"estimates of {len(errors)} jobs: mean absolute error {cost:.1%} in cost, {seconds:.1%} in time"
    emit(rows, ESTIMATE_COLUMNS, as_json=as_json, title=title)


@admin.command("usage")
def usage_command(org: OrgOpt, as_json: JsonOpt = False) -> None:
    """Tokens trained, sampled and served by an organization, per kind and base model, with their cost."""
    from mint.services import auth
    from mint.services.billing.usage import usage_summary

    with _database() as session:
        organization = auth.find_organization(session, org)
        rows = [line.model_dump() for line in usage_summary(session, organization.id)]
    emit(rows, USAGE_COLUMNS, as_json=as_json, title=f"usage of {org}")


DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


def parse_duration_s(text: str) -> float:
    """`90s`, `30m`, `24h`, `7d` or plain seconds, as seconds; a usage error otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a duration; write e.g. 90s, 30m, 24h or 7d")
    return float(match.group(1)) * DURATION_UNITS_S[match.group(2) or "s"]


ORPHAN_COLUMNS = ["key", "bytes", "age", "modified_at"]


@admin.command("gc")
def gc_command(
    grace: Annotated[
        str, typer.Option("--grace", help="Only objects last written longer ago than this (90s, 30m, 24h, 7d).")
    ] = "24h",
    apply: Annotated[bool, typer.Option("--apply", help="Delete the orphans (without it, only list them).")] = False,
    org: Annotated[
        str | None,
        typer.Option("--org", help="Organization whose audit log records the deletion (default: the oldest)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the objects no row references (orphans left by crashes), older than --grace; --apply deletes them."""
    from mint.services import auth
    from mint.services.models.object_gc import collect_garbage
    from mint.services.principal import operator
    from mint.storage.objects import object_store_for

    grace_s = parse_duration_s(grace)
    settings = get_settings()
    actor = None
    if apply:
        with _database(settings) as session:
            organizations = [auth.find_organization(session, org)] if org else auth.list_organizations(session)
            if not organizations:
                raise InvalidRequest("no organization to audit the deletion in; run `mint admin init` first")
            actor = operator(organizations[0].id)
    report = collect_garbage(settings.database, object_store_for(settings), grace_s=grace_s, apply=apply, actor=actor)
    summary = {
        "applied": report.applied,
        "grace_s": report.grace_s,
        "orphans": len(report.orphans),
        "orphan_bytes": report.orphan_bytes,
        "deleted": len(report.deleted),
        "deleted_bytes": report.deleted_bytes,
        "kept": len(report.kept),
    }
    if as_json:
        orphans = [
            {"key": o.key, "size_bytes": o.size_bytes, "modified_at": o.modified_at, "age_s": round(o.age_s, 1)}
            for o in report.orphans
        ]
        emit_one(
            {**summary, "orphan_objects": orphans, "deleted_keys": report.deleted, "kept_keys": report.kept},
            as_json=True,
        )
        return
    rows = [
        {"key": o.key, "bytes": o.size_bytes, "age": _age(o.age_s), "modified_at": o.modified_at}
        for o in report.orphans
    ]
    emit(rows, ORPHAN_COLUMNS, as_json=False, title=f"orphan objects older than {grace}")
    if apply:
        console.print(f"deleted {len(report.deleted)} objects, {report.deleted_bytes} bytes", end="")
        console.print(f"; kept {len(report.kept)} referenced or rewritten since" if report.kept else "")
    else:
        console.print(f"{len(report.orphans)} orphans, {report.orphan_bytes} bytes; delete them with --apply")


def _age(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= DURATION_UNITS_S[unit]:
            return f"{seconds / DURATION_UNITS_S[unit]:.1f}{unit}"
    return f"{seconds:.0f}s"
