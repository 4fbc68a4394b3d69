"""What differs between the RabbitMQ versions the suite runs on (3.10.8, 4.0.5 and 4.3.x),
for tests that assert what their version does instead of skipping on the other."""

from __future__ import annotations


def parts(version: str | tuple[int, ...]) -> tuple[int, ...]:
    """``"4.3.6"`` as ``(4, 3, 6)``."""
    if isinstance(version, tuple):
        return version
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def major(version: str | tuple[int, ...]) -> int:
    """The major version of ``"4.0.5"`` or ``(4, 0, 5)``."""
    return parts(version)[0]


def access(version: str | tuple[int, ...], permission: str) -> str:
    """How a refusal names the access: RabbitMQ 4.x says which permission is missing
    ("write access to exchange ..."), 3.x does not ("access to exchange ...")."""
    return f"{permission} access" if major(version) >= 4 else "access"


def passive_declares_checked(version: str | tuple[int, ...]) -> bool:
    """Whether a passive declare needs a permission on the name: since 4.2.6 and 4.3.0
    (configure there; any permission in later 4.3 releases, rabbitmq-server #16272)."""
    return parts(version) >= (4, 2, 6)


def nack_counts(version: str | tuple[int, ...]) -> bool:
    """Whether a ``basic.nack`` with requeue counts toward a quorum queue's
    ``x-delivery-count`` (and delivery limit): up to 4.2; 4.3 counts a ``basic.reject``
    (and a lost connection), a nack only toward ``x-acquired-count``."""
    return parts(version) < (4, 3)


def consumer_timeout_cancels(version: str | tuple[int, ...]) -> bool:
    """Whether a quorum queue's consumer timeout returns the late delivery and cancels
    the consumer (4.3), where earlier versions close the channel at their periodic check
    (once a minute on 3.10.8, so a hold of seconds past the timeout may go unseen)."""
    return parts(version) >= (4, 3)


def classic_consumer_timeout(version: str | tuple[int, ...]) -> bool:
    """Whether the broker's consumer timeout applies to a classic queue's consumers: up to
    4.2 it does (the channel is closed); 4.3 evaluates it on quorum queues only, so a
    delivery held on a classic queue stays unacked for as long as the consumer likes."""
    return parts(version) < (4, 3)
