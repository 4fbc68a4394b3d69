"""The web apps ``bench/webapp.py`` serves: one route that publishes one delayed message
per request, as a user's app would; the same route answering at once; and the same route
waiting as long as a publish does without publishing (the yardstick).

Served by uvicorn (``webapp_apps:asgi_app``, a FastAPI app with its ``AsyncPublisher``
opened in the lifespan) and by gunicorn's threaded worker (``webapp_apps:wsgi_app``, a
Flask app whose threads share one ``Publisher``, opened on the first request, after the
fork). The environment says what to do: ``DELAYQ_BENCH_URL``, ``DELAYQ_BENCH_NAMESPACE``
(its topology, applied by the bench), ``DELAYQ_BENCH_MODE`` (``publish``, ``none`` or
``wait``: sleep ``DELAYQ_BENCH_WAIT_MS``) and ``DELAYQ_BENCH_GC`` (``freeze``:
``gc.freeze()`` once the app has started, as docs/guides/web-apps.md suggests).
``GET /gc`` answers the time the app spent in CPython's garbage collector so far, and its
collections (all, and full ones), for the bench to say what a request pays there.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from flask import Flask, jsonify
from flask import request as flask_request

from delayq import Publisher, Topology
from delayq.aio import AsyncPublisher
from delayq.errors import DelayqError
from delayq.web import http_answer

URL = os.environ.get("DELAYQ_BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/")
TOPOLOGY = Topology(
    namespace=os.environ.get("DELAYQ_BENCH_NAMESPACE", "benchweb"),
    ladder=["1h"],
    external_bindings=("orders.#",),
)
MODE = os.environ.get("DELAYQ_BENCH_MODE", "publish")
WAIT_S = float(os.environ.get("DELAYQ_BENCH_WAIT_MS", "5")) / 1000
FREEZE = os.environ.get("DELAYQ_BENCH_GC", "default") == "freeze"
DELAY = "1h"


class GcClock:
    """Time in CPython's collector (``gc.callbacks``: called at each collection's start
    and stop, on the thread that collects)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.collections += 1
        self.full += info["generation"] == 2

    def state(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "collections": self.collections, "full": self.full}


GC_CLOCK = GcClock()
gc.callbacks.append(GC_CLOCK)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncPublisher(URL, TOPOLOGY) as publisher:
        if MODE == "publish":
            await publisher.connect()
        app.state.publisher = publisher
        if FREEZE:
            gc.freeze()
        yield


asgi_app = FastAPI(lifespan=lifespan)


@asgi_app.get("/gc")
async def gc_state() -> dict[str, Any]:
    return GC_CLOCK.state()


@asgi_app.post("/orders/{order}/reminder")
async def remind(order: int, request: Request) -> Any:
    if MODE == "none":
        return {"order": order, "id": None}
    if MODE == "wait":
        await asyncio.sleep(WAIT_S)
        return {"order": order, "id": None}
    publisher: AsyncPublisher = request.app.state.publisher
    try:
        receipt = await publisher.publish({"order": order}, "orders.reminder", DELAY)
    except DelayqError as exc:  # the guide's answers (docs/guides/web-apps.md)
        answer = http_answer(exc)
        return JSONResponse({"error": answer.detail}, answer.status, answer.headers)
    return {"order": order, "id": receipt.message_id}


wsgi_app = Flask(__name__)
_publisher: Publisher | None = None
_opening = threading.Lock()


def publisher() -> Publisher:
    """One ``Publisher`` per process, opened after gunicorn forked it."""
    global _publisher
    with _opening:
        if _publisher is None:
            _publisher = Publisher(URL, TOPOLOGY)
        return _publisher


_started = threading.Event()


@wsgi_app.before_request
def started() -> None:
    """Once per process, at its first request (gunicorn forked it and imported the app)."""
    if FREEZE and not _started.is_set():
        with _opening:
            if not _started.is_set():
                gc.freeze()
                _started.set()


@wsgi_app.get("/gc")
def gc_state_sync() -> Any:
    return jsonify(GC_CLOCK.state())


@wsgi_app.post("/orders/<int:order>/reminder")
def remind_sync(order: int) -> Any:
    flask_request.get_data()
    if MODE == "none":
        return jsonify(order=order, id=None)
    if MODE == "wait":
        time.sleep(WAIT_S)
        return jsonify(order=order, id=None)
    try:
        receipt = publisher().publish({"order": order}, "orders.reminder", DELAY)
    except DelayqError as exc:
        answer = http_answer(exc)
        return jsonify(error=answer.detail), answer.status, answer.headers
    return jsonify(order=order, id=receipt.message_id)
