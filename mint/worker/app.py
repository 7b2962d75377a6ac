"""The Celery application: configuration only, no task logic, built on first use.

Runs unchanged on the embedded broker (kombu's SQLAlchemy transport on SQLite) and on
Redis: the broker is a setting. Payloads are ids and JSON only. Tasks are acknowledged
after they finish (`acks_late`) and requeued if their worker dies, so every task is
idempotent and the database row stays the truth (DESIGN.md section 2).

Nothing is built at import: an app reads the model registry and makes the home folder, which
only a process that sends or runs tasks needs (`celery_for`, `celery_app`).
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from mint.config import Settings, get_settings
from mint.schemas.base_models import enabled_base_names
from mint.worker.queues import SYSTEM_QUEUE, all_queues

PRUNE_WORKERS_EVERY_S = 60.0
# Tinker sessions whose heartbeats stopped expire within this long of MINT_TINKER_SESSION_IDLE_S.
EXPIRE_TINKER_SESSIONS_EVERY_S = 60.0


def broker_transport_options(settings: Settings) -> dict[str, object]:
    """Redis redelivers a message not acknowledged within the visibility timeout. The
    embedded SQLite transport has no such timer (its options go to `create_engine`): a
    message taken by a worker that dies is lost there, which is why the database row, not
    the queue, is the truth and a periodic reconciler re-enqueues stranded work."""
    if settings.broker.startswith(("redis://", "rediss://", "sentinel://")):
        return {"visibility_timeout": settings.visibility_timeout_s}
    return {}


def declare_broker_queues(settings: Settings) -> None:
    """Make every shared queue on an SQL broker (`declare_sql_queues`) before this process sends
    or consumes: a worker starting while the API sends its first task, or two workers starting
    together, would otherwise race to create them on a fresh embedded broker, and the loser's
    publish or consume fails on the queue name's unique constraint."""
    from mint.storage.broker import declare_sql_queues

    declare_sql_queues(settings.broker, all_queues(enabled_base_names(settings.model_configs_dir)))


def create_celery(settings: Settings | None = None) -> Celery:
    """A configured Celery app for `settings` (the process settings by default)."""
    settings = settings or get_settings()
    settings.ensure_home()
    app = Celery(
        "mint",
        broker=settings.broker,
        backend=settings.result_backend,
        include=[
            "mint.worker.tasks",
            "mint.worker.eval_tasks",
            "mint.worker.tinker_tasks",
            "mint.worker.autotune_tasks",
        ],
    )
    bases = enabled_base_names(settings.model_configs_dir)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_queues=[Queue(name) for name in all_queues(bases)],
        task_default_queue=SYSTEM_QUEUE,
        broker_transport_options=broker_transport_options(settings),
        broker_connection_retry_on_startup=True,
        result_expires=24 * 3600,
        result_extended=False,
        enable_utc=True,
        timezone="UTC",
        worker_hijack_root_logger=False,
        beat_schedule={
            "prune-dead-workers": {"task": "mint.system.prune_workers", "schedule": PRUNE_WORKERS_EVERY_S},
            "expire-tinker-sessions": {
                "task": "mint.tinker.expire_idle_sessions",
                "schedule": EXPIRE_TINKER_SESSIONS_EVERY_S,
            },
            # Expires: a reconcile that waited longer than one period is superseded by the next.
            "reconcile-jobs": {
                "task": "mint.system.reconcile",
                "schedule": settings.reconcile_every_s,
                "options": {"expires": settings.reconcile_every_s},
            },
            # Webhook deliveries whose message was lost, or whose worker died mid-attempt.
            "resend-webhooks": {
                "task": "mint.webhooks.resend_due",
                "schedule": settings.reconcile_every_s,
                "options": {"expires": settings.reconcile_every_s},
            },
            "retention": {
                "task": "mint.system.retention",
                "schedule": settings.retention_every_s,
                "options": {"expires": settings.retention_every_s},
            },
        },
        beat_schedule_filename=str(settings.home / "beat-schedule"),
    )
    return app


_apps: dict[tuple[str, str], Celery] = {}


def celery_for(settings: Settings) -> Celery:
    """One Celery app (and broker connection pool) per broker and result store, made on first
    use, with the broker's shared queues declared before anything is sent or consumed."""
    key = (settings.broker, settings.result_backend)
    if key not in _apps:
        app = create_celery(settings)
        declare_broker_queues(settings)
        _apps[key] = app
    return _apps[key]


def celery_app() -> Celery:
    """The app of this process's settings: what `mint worker` and `mint beat` run."""
    return celery_for(get_settings())
