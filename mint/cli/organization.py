"""`mint keys list` and `mint audit`: the caller's organization as its API shows it.

Operators with database access use `mint admin keys ...` instead; these need only a key.
"""

from __future__ import annotations

import typer

from mint.cli.options import LimitOpt, Remote, first, remote

keys = typer.Typer(help="API keys of your organization.", no_args_is_help=True)

KEY_COLUMNS = ["id", "name", "prefix", "role", "created_at", "expires_at", "revoked_at", "last_used_at"]
AUDIT_COLUMNS = ["created_at", "actor", "action", "resource_type", "resource_id"]


@keys.command("list")
@remote
def list_keys(api: Remote, limit: LimitOpt = 20) -> None:
    """Keys of your organization, newest first, with their prefix (never the secret)."""
    with api.client() as client:
        rows = first(client.api_keys.list, limit)
    api.table(rows, KEY_COLUMNS, title="API keys")


@remote
def audit(api: Remote, limit: LimitOpt = 20) -> None:
    """Changes to keys, deployments and other audited resources, newest first (admin keys)."""
    with api.client() as client:
        rows = first(client.organization.audit_log, limit)
    api.table(rows, AUDIT_COLUMNS, title="audit log")
