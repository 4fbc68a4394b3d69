"""pika connections for the sync adapter, and the one place pika errors are translated."""

from __future__ import annotations

import random
import time
from typing import Any

import pika
import pika.exceptions as pex

from delayq.conflicts import conflict_from_reply, missing_from_reply
from delayq.errors import BrokerError, ConnectionFailed, DelayqError
from delayq.urls import connection_plan, hosts_in_turn, redact, tried_hosts, validate_url

__all__ = [
    "CONNECTION_ERRORS",
    "connect",
    "host_parameters",
    "parameters",
    "translate_channel_error",
]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    pex.AMQPConnectionError,
    pex.ConnectionClosed,
    pex.StreamLostError,
    pex.ConnectionWrongStateError,
    ConnectionError,
    OSError,
)
"""Errors after which the connection is gone and a fresh one may succeed."""

BLOCKED_CONNECTION_TIMEOUT_S = 30
"""How long a publish waits while the broker blocks publishers (memory or disk alarm)."""


def parameters(url: str, *, name: str) -> pika.URLParameters:
    """pika parameters for a single-host ``url``, with delayq's defaults where it says nothing."""
    validate_url(url)
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # pika raises ValueError, TypeError, KeyError on bad URLs
        raise ConnectionFailed(
            f"cannot use broker URL {redact(url)}: {type(exc).__name__}"
        ) from None
    if "blocked_connection_timeout" not in url:
        params.blocked_connection_timeout = BLOCKED_CONNECTION_TIMEOUT_S
    params.client_properties = {"connection_name": name, "product": "delayq"}
    return params


def host_parameters(
    url: str, *, name: str, rng: random.Random | None = None
) -> list[pika.URLParameters]:
    """pika parameters for each host of ``url``, from a random start."""
    validate_url(url)
    return [parameters(one, name=name) for one in hosts_in_turn(url, rng)]


def connect(
    url: str,
    *,
    name: str = "delayq",
    attempts: int = 3,
    backoff_s: float = 0.25,
    rng: random.Random | None = None,
) -> pika.BlockingConnection:
    """Open a blocking connection, retrying ``attempts`` times with doubling back-off.

    Each round tries every host of ``url`` once, from a random start
    (:func:`delayq.urls.connection_plan`).
    """
    validate_url(url)
    last: BaseException | None = None
    for pause_s, one in connection_plan(url, attempts=attempts, backoff_s=backoff_s, rng=rng):
        if pause_s:
            time.sleep(pause_s)
        try:
            return pika.BlockingConnection(parameters(one, name=name))
        except pex.ProbableAuthenticationError as exc:
            raise ConnectionFailed(
                f"broker at {redact(url)} refused the credentials (wrong user or password?)"
            ) from exc
        except pex.ProbableAccessDeniedError as exc:
            raise ConnectionFailed(
                f"broker at {redact(url)} refused access to the vhost (does it exist, and may "
                "this user use it?)"
            ) from exc
        except CONNECTION_ERRORS as exc:
            last = exc
    raise ConnectionFailed(
        f"cannot connect to the broker at {redact(url)} after {attempts} attempts"
        f"{tried_hosts(url)} ({type(last).__name__}); is RabbitMQ running and the URL right?"
    ) from last


def translate_channel_error(exc: pex.ChannelClosedByBroker) -> DelayqError:
    """A delayq error for a channel the broker closed (404 missing, 406 conflict, ...)."""
    text: str = exc.reply_text or ""
    found: DelayqError | None = missing_from_reply(text) or conflict_from_reply(text)
    if found is not None:
        return found
    return BrokerError(f"the broker closed the channel: ({exc.reply_code}) {text}")


def close_quietly(thing: Any) -> None:
    """Close a channel or connection, ignoring that it may be closed already."""
    try:
        if thing is not None and thing.is_open:
            thing.close()
    except Exception:
        pass
