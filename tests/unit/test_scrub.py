"""Credentials scrubbed from error text (delayq.scrub) and where the consumers apply it."""

from __future__ import annotations

import logging
import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from delayq import InvalidInput, Reject, Topology
from delayq.consume.delivery import (
    H_DEAD_LETTER_REASON,
    H_ERROR_MESSAGE,
    H_ERROR_TRACE,
    Action,
    Delivery,
)
from delayq.consume.planner import DeliveryPlanner
from delayq.consume.retry import FixedBackoff
from delayq.scrub import MASK, scrub, scrubbing

SCRUBBED = [
    ("postgresql://app:s3cret@db/orders", "postgresql://app:***@db/orders"),
    ("postgresql+psycopg://app:p@ss@db:5432/x", "postgresql+psycopg://app:***@db:5432/x"),
    ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
    ("amqps://u:p%40ss@mq/vh?x=1", "amqps://u:***@mq/vh?x=1"),
    ("host=db user=app password=p4ss dbname=x", "host=db user=app password=*** dbname=x"),
    ("PGPASSWORD=abc123 psql", "PGPASSWORD=*** psql"),
    ('{"password": "it\'s secret", "user": "a"}', '{"password": "***", "user": "a"}'),
    ("{'db_password': 'x y z', 'n': 1}", "{'db_password': '***', 'n': 1}"),
    ("https://api/x?api_key=K123&page=2", "https://api/x?api_key=***&page=2"),
    ("X-Api-Key: k-123", "X-Api-Key: ***"),
    ("client_secret = abc", "client_secret = ***"),
    ("Set-Cookie: session_id=abcd; Path=/", "Set-Cookie: ***; Path=/"),
    ("session_id=abcd; Path=/", "session_id=***; Path=/"),
    ("Authorization: Bearer abc.def.ghi-jkl", "Authorization: Bearer ***"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic ***"),
    ("Authorization: raw-token-value", "Authorization: ***"),
    ("authorization=Bearer short", "authorization=***"),
    ("{'Authorization': 'Token abcdefghij'}", "{'Authorization': 'Token ***'}"),
    ("key AKIAIOSFODNN7EXAMPLE here", "key *** here"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key=***"),
    ("gh token ghp_" + "a" * 36, "gh token ***"),
    ("slack xoxb-1234567890-abcdef", "slack ***"),
    ("stripe sk_live_" + "x" * 24, "stripe ***"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "jwt ***"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY----- after",
        "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY----- after",
    ),
    ("-----BEGIN PRIVATE KEY-----\nMIIEcut off", "-----BEGIN PRIVATE KEY-----***"),
    ("{'api_key': 'cut off by a limit", "{'api_key': '***"),
]

LEFT_ALONE = [
    "connection to http://host:8080/path failed",
    "Unexpected token at line 3",
    "user=app host=db",
    "cannot parse 'password' field",
    "timeout after 30s waiting for db:5432",
    "",
    "Basic auth is not configured",
]


@pytest.mark.parametrize(("text", "expected"), SCRUBBED)
def test_credentials_are_scrubbed(text: str, expected: str) -> None:
    assert scrub(text) == expected


@pytest.mark.parametrize("text", LEFT_ALONE)
def test_text_without_credentials_is_left_alone(text: str) -> None:
    assert scrub(text) == text


def test_scrubbing_is_idempotent() -> None:
    for text, _ in SCRUBBED:
        assert scrub(scrub(text)) == scrub(text)


SECRETS = st.text(string.ascii_letters + string.digits + "!$%^*-_+.~", min_size=8, max_size=64)
FORMS = [
    "error: postgresql://app:{s}@db/x",
    "DSN host=db password={s} port=5432",
    '{{"token": "{s}"}}',
    "{{'api_key': '{s}'}}",
    "Authorization: Bearer {s}",
    "failed with secret={s}\nnext line",
    "mongodb://root:{s}@a:27017,b:27017/?authSource=admin",
]


@given(secret=SECRETS, form=st.sampled_from(FORMS))
def test_a_random_secret_never_survives(secret: str, form: str) -> None:
    # A secret spelt like the form's own words ("password", "authSource") is not leaked
    # by leaving those words: only the secret's own place counts.
    assume(secret not in form.format(s=" "))
    text = form.format(s=secret)
    assert secret not in scrub(text), scrub(text)


def test_a_user_scrubber_runs_after_the_default() -> None:
    seen: list[str] = []

    def mine(text: str) -> str:
        seen.append(text)
        return text.replace("ORDER-42", "ORDER-<id>")

    both = scrubbing(mine)
    assert both("ORDER-42 via redis://:pw@h/0") == "ORDER-<id> via redis://:***@h/0"
    assert seen == ["ORDER-42 via redis://:***@h/0"]  # it sees the text already scrubbed


@pytest.mark.parametrize("bad", ["raises", "returns-none"])
def test_a_failing_user_scrubber_leaves_the_default_scrubbing_and_is_logged(
    bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    def mine(text: str) -> str:
        if bad == "raises":
            raise ValueError(f"cannot handle {text}")  # its message holds the text
        return None  # type: ignore[return-value]

    with caplog.at_level(logging.WARNING, logger="delayq.scrub"):
        assert scrubbing(mine)("redis://:hunter2@h/0 failed") == "redis://:***@h/0 failed"
    [record] = caplog.records
    assert "scrubber" in record.getMessage() and "hunter2" not in caplog.text


def test_a_scrubber_that_is_not_callable_is_refused() -> None:
    with pytest.raises(InvalidInput, match="scrubber must be a callable"):
        scrubbing("redact")  # type: ignore[arg-type]


# --- where the consumers apply it: the planner ------------------------------------------------

TOPO = Topology(namespace="ns", ladder=["1s"], destinations=[{"queue": "work", "bindings": ["#"]}])
SECRET = "Zx9-very-secret-Qw7"


def delivery(attempt: int = 1) -> Delivery:
    return Delivery("work", b"{}", "job.a", "m-1", "application/json", {"delayq-attempt": attempt})


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as exc:
        return exc


def planner(**kwargs: object) -> DeliveryPlanner:
    return DeliveryPlanner(
        TOPO,
        "work",
        policy=FixedBackoff(delay="1s", max_attempts=2),
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("attempt", [1, 2])  # a retry, then the dead letter
def test_failure_headers_and_reason_are_scrubbed(attempt: int) -> None:
    error = raised(RuntimeError(f"cannot connect to postgresql://app:{SECRET}@db/x"))
    decision = planner().failure(delivery(attempt), error)
    assert decision.message is not None
    headers = decision.message.headers
    assert "postgresql://app:***@db/x" in headers[H_ERROR_MESSAGE]
    assert "postgresql://app:***@db/x" in headers[H_ERROR_TRACE]
    assert SECRET not in repr(headers) + decision.reason
    if attempt == 2:
        assert decision.action is Action.DEAD_LETTER
        assert decision.reason == f"exhausted: {headers[H_ERROR_MESSAGE]}"


@pytest.mark.parametrize("where", ["end", "start"])
def test_a_one_megabyte_error_with_a_secret_is_scrubbed_and_cut(where: str) -> None:
    filler = "x" * 1_000_000
    text = f"{filler} password={SECRET}" if where == "end" else f"password={SECRET} {filler}"
    decision = planner().failure(delivery(2), raised(Reject(text)))
    assert decision.message is not None
    headers = decision.message.headers
    assert SECRET not in repr(headers) + decision.reason
    assert len(headers[H_ERROR_MESSAGE].encode()) <= 1024
    assert len(headers[H_ERROR_TRACE].encode()) <= 8192
    assert len(decision.reason) < 1100  # the reason reaches logs and records: cut too
    if where == "end":
        assert headers[H_ERROR_TRACE].endswith(f"password={MASK}\n")
    else:
        assert headers[H_ERROR_MESSAGE].startswith(f"password={MASK} xxx")


def test_a_user_scrubber_applies_to_headers_and_reason() -> None:
    p = planner(scrubber=lambda text: text.replace("alice@example.com", "<email>"))
    decision = p.failure(delivery(2), raised(Reject("no mailbox alice@example.com")))
    assert decision.message is not None
    assert decision.message.headers[H_ERROR_MESSAGE] == "no mailbox <email>"
    assert "alice" not in decision.message.headers[H_ERROR_TRACE] + decision.reason


def test_a_raising_user_scrubber_still_dead_letters_with_the_default_scrubbing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(text: str) -> str:
        raise RuntimeError("scrubber bug")

    with caplog.at_level(logging.WARNING, logger="delayq.scrub"):
        decision = planner(scrubber=broken).failure(
            delivery(1), raised(Reject(f"redis://:{SECRET}@cache/0 refused"))
        )
    assert decision.action is Action.DEAD_LETTER and decision.message is not None
    assert decision.message.headers[H_DEAD_LETTER_REASON] == "non-retryable"
    assert decision.message.headers[H_ERROR_MESSAGE] == "redis://:***@cache/0 refused"
    assert SECRET not in repr(decision.message.headers) + decision.reason + caplog.text
    assert any("scrubber" in r.getMessage() for r in caplog.records)


def test_an_exception_whose_str_fails_is_still_dead_lettered() -> None:
    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    decision = planner().failure(delivery(2), raised(Weird()))
    assert decision.action is Action.DEAD_LETTER and decision.message is not None
    assert decision.message.headers[H_ERROR_MESSAGE] == "<Weird: str() failed>"


def test_an_undecodable_body_error_is_scrubbed_too() -> None:
    from delayq.consume.delivery import Undecodable

    decision = planner().undecodable(delivery(), Undecodable(f"bad token={SECRET}"))
    assert decision.message is not None
    assert SECRET not in repr(decision.message.headers) + decision.reason


def test_a_store_error_quoting_its_dsn_is_scrubbed() -> None:
    from delayq.stores.base import store_error

    error = store_error("PostgresStore(...)", ValueError(f"bad dsn postgresql://a:{SECRET}@h/x"))
    assert SECRET not in str(error) and "postgresql://a:***@h/x" in str(error)
