"""Each delayq error a publish raises gets the HTTP answer the web-app guide promises."""

from __future__ import annotations

import pytest

from delayq import errors
from delayq.web import HTTPAnswer, http_answer


@pytest.mark.parametrize(
    ("exc", "status", "retry_after"),
    [
        (errors.PublishNotSent("gone", "m1"), 503, 1),
        (errors.PublishUnconfirmed("lost", "m1"), 503, 1),
        (errors.ConnectionFailed("no broker"), 503, 1),
        (errors.ConnectionRejected("wrong password"), 500, None),
        (errors.PublishBlocked("alarm", "m1"), 503, 30),
        (errors.PublishRejected("full", "m1"), 503, 30),
        (errors.PublishBackpressure("held", "m1"), 503, 30),
        (errors.InvalidDelay("-1s"), 422, None),
        (errors.BodyTooLarge("big"), 422, None),
        (errors.UnboundRoutingKey("no binding", "m1"), 422, None),
        (errors.TopologyNotApplied("apply it"), 500, None),
        (errors.AccessRefused("403"), 500, None),
        (errors.Unroutable("returned", "m1"), 500, None),
        (errors.UnsendableMessage("bug", "m1"), 500, None),
    ],
)
def test_each_error_has_its_answer(exc, status, retry_after):
    answer = http_answer(exc)
    assert (answer.status, answer.retry_after_s) == (status, retry_after)
    expected = {} if retry_after is None else {"Retry-After": str(retry_after)}
    assert answer.headers == expected
    assert answer.message_id == getattr(exc, "message_id", None)


def test_a_batch_is_503_only_when_every_failure_is():
    lost = errors.PublishNotSent("gone", "a")
    full = errors.PublishRejected("full", "b")
    bad = errors.Unroutable("returned", "c")
    both = http_answer(errors.PublishBatchError(["r", None, None], {1: lost, 2: full}))
    assert (both.status, both.retry_after_s) == (503, 30)
    mixed = http_answer(errors.PublishBatchError([None, None], {0: lost, 1: bad}))
    assert (mixed.status, mixed.retry_after_s) == (500, None)


def test_the_detail_of_a_transient_failure_hides_the_broker_url():
    answer = http_answer(errors.ConnectionFailed("cannot connect to amqp://u:secret@host/"))
    assert isinstance(answer, HTTPAnswer)
    assert "secret" not in answer.detail and "host" not in answer.detail
