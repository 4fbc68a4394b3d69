"""Setting the permissions of :mod:`delayq.ops.grant` on a broker.

Two ways, as ``delayq topology grant --apply --via ...`` offers:

- ``rabbitmqctl set_permissions`` on a host that can reach the node (the
  command and its environment decide which node: ``-n``, ``RABBITMQ_NODENAME``,
  the Erlang cookie in ``$HOME``);
- the management API, ``PUT /api/permissions/<vhost>/<user>``.

No password is involved: users must exist already.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from delayq.errors import BrokerError, InvalidInput
from delayq.ops.rabbitmqctl import run_ctl

if TYPE_CHECKING:  # the CLI's help reads VIAS: no pydantic (ops.grant) for it
    from delayq.ops.grant import Grant, Permissions
    from delayq.ops.management import ManagementAPI

__all__ = [
    "VIAS",
    "apply_grant",
    "current_permissions",
    "describe_permissions",
    "rabbitmqctl_command",
    "replacement_refused",
]

VIAS = ("rabbitmqctl", "management")


def rabbitmqctl_command(grant: Grant, rabbitmqctl: Sequence[str] = ("rabbitmqctl",)) -> str:
    """The shell command that sets ``grant``, quoted to copy and paste."""
    return shlex.join([*rabbitmqctl, *grant.rabbitmqctl_args()])


def current_permissions(
    grant: Grant,
    via: str,
    *,
    management: ManagementAPI | None = None,
    rabbitmqctl: Sequence[str] = ("rabbitmqctl",),
    timeout_s: float = 60.0,
) -> Permissions | None:
    """The permissions ``grant.user`` holds on ``grant.vhost`` now (``None``: none).

    RabbitMQ keeps one set per user and vhost: setting a grant replaces this set."""
    if via == "management":
        if management is None:
            raise InvalidInput("--via management needs a management URL (--management-url)")
        found = management.permissions(grant.vhost, grant.user)
        return None if not found else _permissions(found)
    out = run_ctl(
        rabbitmqctl,
        ["list_user_permissions", grant.user, "--formatter", "json"],
        what=f"rabbitmqctl list_user_permissions for user {grant.user!r}",
        timeout_s=timeout_s,
        hint="pass --rabbitmqctl with its path, or use --via management",
    )
    try:
        rows = json.loads(out or "[]")
    except ValueError:
        shown = out[:200]
        raise BrokerError(f"rabbitmqctl list_user_permissions printed no JSON: {shown!r}") from None
    for row in rows:
        if isinstance(row, dict) and row.get("vhost") == grant.vhost:
            return _permissions(row)
    return None


def _permissions(row: dict[str, object]) -> Permissions:
    from delayq.ops.grant import Permissions

    return Permissions(str(row["configure"]), str(row["write"]), str(row["read"]))


def describe_permissions(p: Permissions) -> str:
    return f"configure {p.configure!r}, write {p.write!r}, read {p.read!r}"


def replacement_refused(grant: Grant, current: Permissions) -> InvalidInput:
    """The error of a grant that would replace a user's other rights on its vhost."""
    return InvalidInput(
        f"user {grant.user!r} already has {describe_permissions(current)} on vhost "
        f"{grant.vhost!r}; the {grant.role.value} grant would replace them with "
        f"{describe_permissions(grant.permissions)} (RabbitMQ keeps one set per user and "
        "vhost), which can take rights it needs elsewhere away. Nothing was set: give the "
        "role a user of its own, or pass --replace to replace them"
    )


def apply_grant(
    grant: Grant,
    via: str,
    *,
    management: ManagementAPI | None = None,
    rabbitmqctl: Sequence[str] = ("rabbitmqctl",),
    timeout_s: float = 60.0,
) -> None:
    """Set ``grant``'s permissions, raising a :class:`~delayq.errors.BrokerError` if refused."""
    if via == "management":
        if management is None:
            raise InvalidInput("--via management needs a management URL (--management-url)")
        management.set_permissions(grant.vhost, grant.user, grant.management_body())
        return
    if via != "rabbitmqctl":
        raise InvalidInput(f"--via must be one of {', '.join(VIAS)}, not {via!r}")
    run_ctl(
        rabbitmqctl,
        grant.rabbitmqctl_args(),
        what=f"rabbitmqctl set_permissions for user {grant.user!r} on vhost {grant.vhost!r}",
        timeout_s=timeout_s,
        hint="pass --rabbitmqctl with its path, or use --via management",
    )
