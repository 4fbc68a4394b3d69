"""Setting the permissions of :mod:`delayq.ops.grant` on a broker.

Two ways, as ``delayq topology grant --apply --via ...`` offers:

- ``rabbitmqctl set_permissions`` on a host that can reach the node (the
  command and its environment decide which node: ``-n``, ``RABBITMQ_NODENAME``,
  the Erlang cookie in ``$HOME``);
- the management API, ``PUT /api/permissions/<vhost>/<user>``.

No password is involved: users must exist already.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from delayq.errors import InvalidInput
from delayq.ops.grant import Grant
from delayq.ops.management import ManagementAPI
from delayq.ops.rabbitmqctl import run_ctl

__all__ = ["VIAS", "apply_grant", "rabbitmqctl_command"]

VIAS = ("rabbitmqctl", "management")


def rabbitmqctl_command(grant: Grant, rabbitmqctl: Sequence[str] = ("rabbitmqctl",)) -> str:
    """The shell command that sets ``grant``, quoted to copy and paste."""
    return shlex.join([*rabbitmqctl, *grant.rabbitmqctl_args()])


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
