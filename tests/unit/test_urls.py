"""Broker URLs naming several hosts: splitting, validation, redaction, the order of attempts."""

from __future__ import annotations

import asyncio
import random

import pytest

from delayq.errors import ConnectionFailed, InvalidURL
from delayq.local.node import free_port
from delayq.urls import (
    connection_plan,
    host_label,
    host_urls,
    hosts_in_turn,
    redact,
    tried_hosts,
    validate_url,
)

CLUSTER = "amqp://app:s3cret@rabbit1:5672,rabbit2:5673,[::1]:5674/orders?heartbeat=30"


def test_a_multi_host_url_splits_into_single_host_urls_sharing_credentials_vhost_and_query():
    assert host_urls(CLUSTER) == [
        "amqp://app:s3cret@rabbit1:5672/orders?heartbeat=30",
        "amqp://app:s3cret@rabbit2:5673/orders?heartbeat=30",
        "amqp://app:s3cret@[::1]:5674/orders?heartbeat=30",
    ]
    assert validate_url(CLUSTER) == CLUSTER


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:guest@localhost:5672/",
        "amqps://u:p@h/vh?x=a,b",  # a comma in the query is not a list of hosts
        "amqp://h",
    ],
)
def test_a_single_host_url_is_its_own_only_host(url: str) -> None:
    assert host_urls(url) == [url]
    assert tried_hosts(url) == ""


def test_host_labels_name_host_and_port_with_the_scheme_default():
    assert [host_label(u) for u in host_urls(CLUSTER)] == [
        "rabbit1:5672",
        "rabbit2:5673",
        "[::1]:5674",
    ]
    assert host_label("amqps://h/") == "h:5671"
    assert tried_hosts(CLUSTER) == (
        " on each of its 3 hosts (rabbit1:5672, rabbit2:5673, [::1]:5674)"
    )


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:s3cret@h1,,h2/",
        "amqp://u:s3cret@h1,/",
        "amqp://u:s3cret@h1:5672,h2:99999/",
        "amqp://u:s3cret@h1:5672,h2:0/",
        "http://u:s3cret@h1,h2/",
        "amqp://u:s3cret@h1,[::1/",
    ],
)
def test_a_bad_host_in_the_list_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(InvalidURL) as info:
        validate_url(url)
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


def test_redact_hides_the_password_of_a_multi_host_url_and_keeps_every_host():
    assert redact(CLUSTER) == "amqp://app:***@rabbit1:5672,rabbit2:5673,[::1]:5674/orders?heartbeat=30"
    assert redact("amqp://h1:1,h2:2/") == "amqp://h1:1,h2:2/"


def test_hosts_in_turn_tries_every_host_once_in_rotation():
    hosts = host_urls(CLUSTER)
    for seed in range(20):
        order = hosts_in_turn(CLUSTER, random.Random(seed))
        start = hosts.index(order[0])
        assert order == hosts[start:] + hosts[:start]


def test_clients_spread_their_first_attempt_over_the_hosts():
    rng = random.Random(7)
    firsts = {hosts_in_turn(CLUSTER, rng)[0] for _ in range(60)}
    assert firsts == set(host_urls(CLUSTER))


def test_the_connection_plan_pauses_only_between_rounds_and_doubles():
    plan = connection_plan("amqp://a,b,c/", attempts=3, backoff_s=0.25, rng=random.Random(1))
    assert [pause for pause, _ in plan] == [0.0, 0.0, 0.0, 0.25, 0.0, 0.0, 0.5, 0.0, 0.0]
    rounds = [[url for _, url in plan[i : i + 3]] for i in (0, 3, 6)]
    assert rounds[0] == rounds[1] == rounds[2]
    assert sorted(rounds[0]) == ["amqp://a/", "amqp://b/", "amqp://c/"]


def test_a_single_host_plan_is_the_old_retry_loop():
    plan = connection_plan("amqp://h/", attempts=3, backoff_s=0.25)
    assert plan == [(0.0, "amqp://h/"), (0.25, "amqp://h/"), (0.5, "amqp://h/")]


def _dead_cluster_url() -> str:
    return f"amqp://app:s3cret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/"


def test_sync_connect_names_every_host_it_tried_and_never_the_password():
    from delayq.sync._connection import connect

    url = _dead_cluster_url()
    with pytest.raises(ConnectionFailed) as info:
        connect(url, attempts=2, backoff_s=0.01)
    message = str(info.value)
    assert "s3cret" not in message
    for one in host_urls(url):
        assert host_label(one) in message
    assert "each of its 2 hosts" in message


def test_async_connect_names_every_host_it_tried_and_never_the_password():
    from delayq.aio._connection import connect

    url = _dead_cluster_url()
    with pytest.raises(ConnectionFailed) as info:
        asyncio.run(connect(url, attempts=2, backoff_s=0.01, timeout_s=2))
    message = str(info.value)
    assert "s3cret" not in message
    for one in host_urls(url):
        assert host_label(one) in message


@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        ("amqp://h", "/"),
        ("amqp://h/", "/"),
        ("amqp://h/%2F", "/"),
        ("amqp://h/shop", "shop"),
        ("amqp://h/%2Fshop", "/shop"),
        ("amqp://u:p@h1:1,h2:2/orders?heartbeat=30", "orders"),
    ],
)
def test_the_vhost_of_a_url_is_read_as_pika_reads_it(url: str, vhost: str) -> None:
    import pika

    from delayq.urls import url_vhost

    assert url_vhost(url) == vhost
    if "," not in url:
        assert pika.URLParameters(url).virtual_host == vhost


def test_check_vhost_refuses_only_a_named_vhost_that_differs() -> None:
    from delayq.errors import InvalidInput
    from delayq.urls import check_vhost

    check_vhost(None, "amqp://h/anything")
    check_vhost("/shop", "amqp://h/%2Fshop")
    check_vhost("/shop", "memory://test")
    says = r"names vhost '/shop', the URL connects to vhost 'shop'"
    with pytest.raises(InvalidInput, match=says):
        check_vhost("/shop", "amqp://u:secret@h/shop")
    with pytest.raises(InvalidInput) as refused:
        check_vhost("/", "amqp://u:secret@h/x")
    assert "secret" not in str(refused.value)
