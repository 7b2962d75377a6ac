"""Who is calling (`Principal`): one key of one organization, with its role.

A module of its own because every service that checks a role or writes the audit log needs
it, while only `auth` needs keys and organizations: `audit` and `auth` then import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from mint.errors import PermissionDenied

ROLE_RANK = {"viewer": 0, "developer": 1, "admin": 2}


@dataclass(frozen=True)
class Principal:
    """Who is calling: one key of one organization, with its role."""

    organization_id: str
    key_id: str | None
    role: str
    name: str

    def require(self, role: str) -> None:
        """Raise PermissionDenied unless this principal's role is at least `role`."""
        if ROLE_RANK[self.role] < ROLE_RANK[role]:
            raise PermissionDenied(
                f"This operation needs a {role} key; the key {self.name!r} has role {self.role}. "
                f"Ask an admin of your organization for a {role} key."
            )

    @property
    def actor(self) -> str:
        return f"key:{self.key_id}" if self.key_id else self.name


def operator(organization_id: str) -> Principal:
    """The principal of an operator acting through `mint admin` with database access."""
    return Principal(organization_id=organization_id, key_id=None, role="admin", name="operator")
