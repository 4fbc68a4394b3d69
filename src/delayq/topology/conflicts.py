"""Reading the broker's refusals: PRECONDITION_FAILED, NOT_FOUND and ACCESS_REFUSED texts.

RabbitMQ names the first inequivalent argument and both values, for example::

    PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/':
    received '2000' but current is '1000'

which is enough for an error that tells the operator exactly what differs.
"""

from __future__ import annotations

import re

from delayq.errors import AccessRefused, ParkedAtRisk, TopologyConflict, TopologyMissing

__all__ = [
    "conflict_from_reply",
    "missing_from_reply",
    "parked_at_risk",
    "refused_from_reply",
]

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']*)'"
    r" in vhost '[^']*': received (?P<received>.+?) but current is (?P<current>.+)$"
)
_VALUE = re.compile(r"(?:the value )?'(?P<value>.*?)'(?: of type '[^']*')?")
_NOT_FOUND = re.compile(r"no (?P<kind>queue|exchange) '(?P<name>[^']*)'")
# RabbitMQ 3.x says "access to queue 'q' ..."; 4.x names the permission that is
# missing: "configure access to ...", "read access to ...", "write access to ...".
_REFUSED = re.compile(
    r"ACCESS_REFUSED - (?:(?P<permission>configure|read|write) )?access to "
    r"(?P<kind>queue|exchange) '(?P<name>[^']*)' in vhost "
    r"'(?P<vhost>[^']*)' refused for user '(?P<user>[^']*)'"
)


def _value(text: str) -> str | None:
    text = text.strip()
    if text == "none":
        return None
    match = _VALUE.fullmatch(text)
    return match.group("value") if match else text


def conflict_from_reply(reply_text: str) -> TopologyConflict | None:
    """A :class:`TopologyConflict` for a PRECONDITION_FAILED text, else ``None``."""
    match = _INEQUIVALENT.search(reply_text)
    if match is None:
        return None
    return TopologyConflict(
        kind=match.group("kind"),
        name=match.group("name"),
        argument=match.group("arg"),
        current=_value(match.group("current")),
        wanted=_value(match.group("received")),
    )


def missing_from_reply(reply_text: str) -> TopologyMissing | None:
    """A :class:`TopologyMissing` for a NOT_FOUND text, else ``None``."""
    match = _NOT_FOUND.search(reply_text)
    if match is None:
        return None
    return TopologyMissing(
        f"{match.group('kind')} {match.group('name')!r} does not exist: the delayq topology "
        "is not applied on this broker/vhost. Run `delayq topology apply` "
        "(or apply_topology()) first."
    )


def refused_from_reply(reply_text: str) -> AccessRefused | None:
    """An :class:`AccessRefused` for an ACCESS_REFUSED text about an entity, else ``None``."""
    match = _REFUSED.search(reply_text)
    if match is None:
        if "ACCESS_REFUSED" not in reply_text:
            return None
        return AccessRefused(  # a wording of another version (topic permissions, ...)
            f"the broker refused access: {reply_text.strip()}. `delayq topology grant` "
            "prints what a producer and a consumer need."
        )
    permission = match.group("permission")
    access = f"{permission} access" if permission else "access"
    return AccessRefused(
        f"the broker refused user {match.group('user')!r} {access} to {match.group('kind')} "
        f"{match.group('name')!r} in vhost {match.group('vhost')!r} (ACCESS_REFUSED): the "
        "user's permissions do not cover it. `delayq topology grant` prints what a producer "
        "and a consumer need."
    )


SAFE_PARKED_LIMIT = 1_000_000
"""A parked queue whose delivery limit is at least this can be browsed without fear."""


def parked_at_risk(conflict: TopologyConflict | None, server_version: str) -> ParkedAtRisk | None:
    """Whether browsing a parked queue by returning its messages would lose them.

    ``conflict``: what the broker said when the queue was declared again with the
    parked arguments (``None``: it has them). Only RabbitMQ 4 and later give quorum queues
    a delivery limit by default; a queue without the argument is safe on 3.x. A conflict
    on another argument (the queue is classic, say) says nothing of the limit.
    """
    if conflict is None or conflict.argument != "x-delivery-limit":
        return None
    current = conflict.current
    major = server_version.split(".", 1)[0]
    four = major.isdigit() and int(major) >= 4
    if current is None or not current.lstrip("-").isdigit():
        risky = four  # no limit of its own: 4.x's default of 20 applies
    else:
        limit = int(current)  # -1: none on 4.x, but the first return drops it on 3.x
        risky = limit < SAFE_PARKED_LIMIT and (limit >= 0 or not four)
    if not risky:
        return None
    return ParkedAtRisk(conflict.name, current, conflict.wanted, server_version or "?")
