"""SQLAlchemy 2.0 tables: the whole data model of DESIGN.md section 4, one module per domain.

`base` holds the declarative `Base`, `new_id`, `utcnow`, `as_utc` and the shared columns; every other
module holds the tables of one domain, as `mint.services` is split, and imports only `base`.
Importing this package imports every module, so that `Base.metadata` holds every table (migrations
and `create_all` rely on it), and re-exports every table, enumeration and helper: importers write
`from mint.storage.tables import X` whatever module X lives in.
"""

from __future__ import annotations

from mint.storage.tables.autotune import (
    AUTOTUNE_STATUSES,
    AutotuneRun,
    AutotuneTrial,
)
from mint.storage.tables.base import (
    ID_LENGTH,
    NAMING_CONVENTION,
    Base,
    as_utc,
    created_column,
    id_column,
    new_id,
    one_of,
    organization_column,
    utcnow,
)
from mint.storage.tables.base_models import (
    BaseModelRow,
)
from mint.storage.tables.benchmarks import (
    Benchmark,
    BenchmarkVersion,
)
from mint.storage.tables.billing import (
    USAGE_KINDS,
    Price,
    UsageRecord,
)
from mint.storage.tables.datasets import (
    DATASET_KINDS,
    DATASET_STATUSES,
    Dataset,
)
from mint.storage.tables.episodes import (
    Episode,
    EpisodeTurn,
)
from mint.storage.tables.evals import (
    EVAL_STATUSES,
    EvalRun,
    Trajectory,
)
from mint.storage.tables.jobs import (
    EVENT_LEVELS,
    EVENT_TYPES,
    JOB_METHODS,
    JOB_STATUSES,
    Checkpoint,
    JobEvent,
    TrainingJob,
)
from mint.storage.tables.models import (
    ADAPTER_VERSION_STATUSES,
    VERSION_KINDS,
    Adapter,
    AdapterVersion,
)
from mint.storage.tables.organizations import (
    ROLES,
    ApiKey,
    AuditLog,
    Organization,
)
from mint.storage.tables.reviews import (
    REVIEW_SOURCES,
    Review,
    ReviewItem,
    ReviewQueue,
)
from mint.storage.tables.reward_endpoints import (
    RewardEndpoint,
)
from mint.storage.tables.serving import (
    DEPLOYMENT_KINDS,
    DEPLOYMENT_STATUSES,
    REVISION_ACTIONS,
    Capture,
    Deployment,
    DeploymentRevision,
    Feedback,
    ServingNode,
)
from mint.storage.tables.tinker import (
    FUTURE_STATUSES,
    SESSION_KINDS,
    SESSION_STATUSES,
    TINKER_CHECKPOINT_KINDS,
    TINKER_SESSION_STATUSES,
    Future,
    TinkerCheckpoint,
    TinkerSession,
    TrainingSession,
)
from mint.storage.tables.webhooks import (
    WEBHOOK_DELIVERY_STATUSES,
    Webhook,
    WebhookDelivery,
)
from mint.storage.tables.workers import (
    Worker,
)

__all__ = [
    "ADAPTER_VERSION_STATUSES",
    "AUTOTUNE_STATUSES",
    "Adapter",
    "AdapterVersion",
    "ApiKey",
    "AuditLog",
    "AutotuneRun",
    "AutotuneTrial",
    "Base",
    "BaseModelRow",
    "Benchmark",
    "BenchmarkVersion",
    "Capture",
    "Checkpoint",
    "DATASET_KINDS",
    "DATASET_STATUSES",
    "DEPLOYMENT_KINDS",
    "DEPLOYMENT_STATUSES",
    "Dataset",
    "Deployment",
    "DeploymentRevision",
    "EVAL_STATUSES",
    "Episode",
    "EpisodeTurn",
    "EVENT_LEVELS",
    "EVENT_TYPES",
    "EvalRun",
    "FUTURE_STATUSES",
    "Feedback",
    "Future",
    "ID_LENGTH",
    "JOB_METHODS",
    "JOB_STATUSES",
    "JobEvent",
    "NAMING_CONVENTION",
    "Organization",
    "Price",
    "REVIEW_SOURCES",
    "REVISION_ACTIONS",
    "Review",
    "ReviewItem",
    "ReviewQueue",
    "RewardEndpoint",
    "ROLES",
    "SESSION_KINDS",
    "SESSION_STATUSES",
    "ServingNode",
    "TINKER_CHECKPOINT_KINDS",
    "TINKER_SESSION_STATUSES",
    "TinkerCheckpoint",
    "TinkerSession",
    "TrainingJob",
    "TrainingSession",
    "Trajectory",
    "USAGE_KINDS",
    "UsageRecord",
    "VERSION_KINDS",
    "WEBHOOK_DELIVERY_STATUSES",
    "Webhook",
    "WebhookDelivery",
    "Worker",
    "as_utc",
    "created_column",
    "id_column",
    "new_id",
    "one_of",
    "organization_column",
    "utcnow",
]
