"""Reading the broker's PRECONDITION_FAILED and NOT_FOUND reply texts."""

from __future__ import annotations

import pickle

import pytest

from delayq.errors import AccessRefused, BrokerError, TopologyConflict, TopologyMissing
from delayq.topology.conflicts import conflict_from_reply, missing_from_reply, refused_from_reply
from delayq.topology.declarations import ExchangeDecl, QueueDecl
from delayq.topology.report import ApplyReport, ApplyResult, ApplyStatus

TTL_CHANGED = (
    "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q1' in vhost '/': "
    "received '2000' but current is '1000'"
)
TTL_NOT_WANTED = (
    "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q1' in vhost '/': "
    "received none but current is the value '1000' of type 'signedint'"
)
OVERFLOW_NOT_SET = (
    "PRECONDITION_FAILED - inequivalent arg 'x-overflow' for queue 'q1' in vhost '/': "
    "received the value 'reject-publish' of type 'longstr' but current is none"
)
EXCHANGE_TYPE = (
    "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'e1' in vhost '/': "
    "received 'topic' but current is 'fanout'"
)
NO_EXCHANGE = "NOT_FOUND - no exchange 'nope-ex' in vhost '/'"


@pytest.mark.parametrize(
    ("reply", "kind", "name", "argument", "current", "wanted"),
    [
        (TTL_CHANGED, "queue", "q1", "x-message-ttl", "1000", "2000"),
        (TTL_NOT_WANTED, "queue", "q1", "x-message-ttl", "1000", None),
        (OVERFLOW_NOT_SET, "queue", "q1", "x-overflow", None, "reject-publish"),
        (EXCHANGE_TYPE, "exchange", "e1", "type", "fanout", "topic"),
    ],
    ids=["ttl-changed", "ttl-not-wanted", "overflow-not-set", "exchange-type"],
)
def test_conflict_fields(
    reply: str, kind: str, name: str, argument: str, current: str | None, wanted: str | None
) -> None:
    conflict = conflict_from_reply(reply)
    assert isinstance(conflict, TopologyConflict)
    assert (conflict.kind, conflict.name, conflict.argument) == (kind, name, argument)
    assert conflict.current == current
    assert conflict.wanted == wanted


def test_conflict_with_typed_values_on_both_sides() -> None:
    conflict = conflict_from_reply(
        "PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'q2' in vhost 'v': "
        "received the value 'quorum' of type 'longstr' but current is the value 'classic' "
        "of type 'longstr'"
    )
    assert conflict is not None
    assert (conflict.current, conflict.wanted) == ("classic", "quorum")


def test_conflict_in_another_vhost() -> None:
    conflict = conflict_from_reply(TTL_CHANGED.replace("vhost '/'", "vhost 'shop'"))
    assert conflict is not None
    assert conflict.name == "q1"


def test_conflict_message_shows_both_values() -> None:
    message = str(conflict_from_reply(TTL_CHANGED))
    assert "queue 'q1'" in message
    assert "x-message-ttl='1000'" in message
    assert "x-message-ttl='2000'" in message


def test_conflict_message_says_what_to_do() -> None:
    message = str(conflict_from_reply(TTL_CHANGED))
    assert "delete the queue" in message
    assert "apply again" in message
    assert "change the topology" in message


def test_conflict_message_shows_none_as_not_set() -> None:
    message = str(conflict_from_reply(OVERFLOW_NOT_SET))
    assert "x-overflow=(not set)" in message
    assert "x-overflow='reject-publish'" in message


def test_conflict_message_names_the_exchange_kind() -> None:
    message = str(conflict_from_reply(EXCHANGE_TYPE))
    assert "exchange 'e1'" in message
    assert "delete the exchange" in message


def test_conflict_is_a_broker_error() -> None:
    assert isinstance(conflict_from_reply(TTL_CHANGED), BrokerError)


def test_conflict_survives_pickling() -> None:
    conflict = conflict_from_reply(TTL_CHANGED)
    assert conflict is not None
    copy = pickle.loads(pickle.dumps(conflict))
    assert (copy.kind, copy.name, copy.argument, copy.current, copy.wanted) == (
        "queue",
        "q1",
        "x-message-ttl",
        "1000",
        "2000",
    )


@pytest.mark.parametrize(
    "reply",
    [NO_EXCHANGE, "", "PRECONDITION_FAILED - something else", "ACCESS_REFUSED - no"],
    ids=["not-found", "empty", "other-precondition", "access-refused"],
)
def test_not_a_conflict(reply: str) -> None:
    assert conflict_from_reply(reply) is None


# --- NOT_FOUND -----------------------------------------------------------------------------------


def test_missing_exchange() -> None:
    missing = missing_from_reply(NO_EXCHANGE)
    assert isinstance(missing, TopologyMissing)
    assert "exchange 'nope-ex'" in str(missing)


def test_missing_says_to_apply_the_topology() -> None:
    assert "delayq topology apply" in str(missing_from_reply(NO_EXCHANGE))


def test_missing_queue() -> None:
    missing = missing_from_reply("NOT_FOUND - no queue 'orders' in vhost '/'")
    assert missing is not None
    assert "queue 'orders'" in str(missing)


@pytest.mark.parametrize("reply", [TTL_CHANGED, "", "NOT_FOUND - something else"])
def test_not_missing(reply: str) -> None:
    assert missing_from_reply(reply) is None


# --- ACCESS_REFUSED ------------------------------------------------------------------------------

REFUSED = (
    "ACCESS_REFUSED - access to exchange 'other.unrouted' in vhost '/' refused for user 'prod'"
)


def test_access_refused_names_user_entity_and_vhost() -> None:
    refused = refused_from_reply(REFUSED)
    assert isinstance(refused, AccessRefused)
    text = str(refused)
    assert "user 'prod'" in text and "exchange 'other.unrouted'" in text and "vhost '/'" in text
    assert "delayq topology grant" in text


def test_access_refused_on_a_queue() -> None:
    reply = "ACCESS_REFUSED - access to queue 'orders' in vhost 'prod' refused for user 'app'"
    assert "queue 'orders' in vhost 'prod'" in str(refused_from_reply(reply))


# RabbitMQ 4.x names the permission that is missing (texts as a 4.0.5 node sends them).
@pytest.mark.parametrize(
    ("reply", "access", "entity"),
    [
        (
            "ACCESS_REFUSED - configure access to queue 'newq' in vhost '/' refused for user 'u'",
            "configure access",
            "queue 'newq'",
        ),
        (
            "ACCESS_REFUSED - write access to exchange 'ex' in vhost '/' refused for user 'u'",
            "write access",
            "exchange 'ex'",
        ),
        (
            "ACCESS_REFUSED - read access to queue 'qq' in vhost '/' refused for user 'u'",
            "read access",
            "queue 'qq'",
        ),
    ],
)
def test_access_refused_in_rabbitmq_4_words(reply: str, access: str, entity: str) -> None:
    refused = refused_from_reply(reply)
    assert isinstance(refused, AccessRefused)
    assert f"user 'u' {access} to {entity} in vhost '/'" in str(refused)


def test_an_access_refused_in_other_words_is_still_refused() -> None:
    reply = "ACCESS_REFUSED - write access to topic 'k' in exchange 'x' refused for user 'u'"
    refused = refused_from_reply(reply)
    assert isinstance(refused, AccessRefused)
    assert "topic 'k' in exchange 'x'" in str(refused) and "delayq topology grant" in str(refused)


@pytest.mark.parametrize("reply", [TTL_CHANGED, NO_EXCHANGE, "", "PRECONDITION_FAILED - no"])
def test_not_refused(reply: str) -> None:
    assert refused_from_reply(reply) is None


# --- the apply report that carries conflicts -----------------------------------------------------


def _report() -> ApplyReport:
    conflict = conflict_from_reply(TTL_CHANGED)
    return ApplyReport(
        [
            ApplyResult(ExchangeDecl("e", "fanout"), ApplyStatus.CREATED),
            ApplyResult(QueueDecl("q0"), ApplyStatus.PRESENT),
            ApplyResult(QueueDecl("q1"), ApplyStatus.CONFLICT, conflict),
        ]
    )


def test_report_lists_conflicts_and_is_not_ok() -> None:
    report = _report()
    assert not report.ok
    assert [c.name for c in report.conflicts] == ["q1"]


def test_report_raises_the_first_conflict() -> None:
    with pytest.raises(TopologyConflict, match="q1"):
        _report().raise_for_conflicts()


def test_report_summary() -> None:
    assert _report().summary() == "1 created, 1 present, 1 conflict"
    assert ApplyReport().summary() == "nothing to declare"


def test_report_without_conflicts_is_ok_and_does_not_raise() -> None:
    report = ApplyReport([ApplyResult(QueueDecl("q"), ApplyStatus.CREATED)])
    assert report.ok
    report.raise_for_conflicts()
    assert report.count(ApplyStatus.CREATED) == 1
