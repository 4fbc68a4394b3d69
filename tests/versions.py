"""What differs between the RabbitMQ versions the suite runs on (3.10.8 and 4.0.5), for
tests that assert what their version does instead of skipping on the other."""

from __future__ import annotations


def major(version: str | tuple[int, ...]) -> int:
    """The major version of ``"4.0.5"`` or ``(4, 0, 5)``."""
    if isinstance(version, tuple):
        return version[0]
    return int(version.split(".", 1)[0])


def access(version: str | tuple[int, ...], permission: str) -> str:
    """How a refusal names the access: RabbitMQ 4.x says which permission is missing
    ("write access to exchange ..."), 3.x does not ("access to exchange ...")."""
    return f"{permission} access" if major(version) >= 4 else "access"
