"""Tracing a Spark scheduling job (``tracing=`` a provider factory) against a real broker:
each executor's Python worker builds its provider, whose exporter writes finished spans
as JSON lines to a file of its own (an in-memory exporter on the driver would not see
the executors' spans), and every ``publish`` span is a child of the driver's job span."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from delayq import ConnectionFailed, InvalidInput, MissingExtra, RowsRejected, Topology
from delayq.message.bulk import key_message_id
from delayq.observe import tracing as tracing_module
from delayq.spark import schedule, schedule_stream
from delayq.spark._tracing import JobTracing
from delayq.sync import apply_topology
from tests.amqp import depth
from tests.waiting import wait_for

SCHEMA = "key string, routing_key string, delay string, body string"


def span_files(folder: Path, *, fail_off: int | None = None) -> Callable[[], Any]:
    """A provider factory writing each process's finished spans to
    ``folder/spans-<pid>.jsonl``; with ``fail_off`` (a pid) it raises in every process
    but that one (an exporter the executors cannot reach)."""
    where = str(folder)

    def make_provider() -> Any:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        if fail_off is not None and os.getpid() != fail_off:
            raise RuntimeError("no collector here")
        out = open(os.path.join(where, f"spans-{os.getpid()}.jsonl"), "a", encoding="utf-8")
        exporter = ConsoleSpanExporter(out=out, formatter=lambda s: s.to_json(indent=None) + "\n")
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider

    return make_provider


def read_spans(folder: Path) -> dict[int, list[dict[str, Any]]]:
    """The spans exported, by the pid of the process that exported them."""
    return {
        int(path.stem.removeprefix("spans-")): [
            json.loads(line) for line in path.read_text().splitlines()
        ]
        for path in folder.glob("spans-*.jsonl")
    }


def drain(url: str, queue: str) -> dict[str, dict[str, Any]]:
    """The messages in ``queue``, taken: headers by message id."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        got: dict[str, dict[str, Any]] = {}
        while True:
            method, properties, _ = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got[properties.message_id] = dict(properties.headers or {})
    finally:
        connection.close()


def rows(n: int, *, bad: int = 0) -> list[tuple[str, str, str, str]]:
    """``n`` rows to publish at once, the first ``bad`` with a delay that is no duration."""
    return [
        (f"row-{i}", "job.a", "soon" if i < bad else "0s", json.dumps({"n": i})) for i in range(n)
    ]


def test_each_published_row_is_a_publish_span_child_of_the_job_span(
    spark: Any,
    rabbitmq_url: str,
    make_topology: Callable[..., Topology],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    df = spark.createDataFrame(rows(20, bad=2), SCHEMA)
    exporter = InMemorySpanExporter()  # the driver's: the application's own provider
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)

    with provider.get_tracer("app").start_as_current_span("campaign") as campaign:
        with pytest.raises(RowsRejected) as raised:  # 2 rejected, 1 allowed: the job's error
            schedule(
                df,
                url=rabbitmq_url,
                topology=topology,
                delay_col="delay",
                partitions=2,
                max_rejected=1,
                tracing=span_files(tmp_path),
            )

    summary = raised.value.summary
    assert summary.total_published == 18 and summary.total_rejected == 2
    job, outer = exporter.get_finished_spans()
    assert (job.name, outer.name) == (f"schedule {topology.namespace}", "campaign")
    assert job.status.status_code == trace.StatusCode.ERROR
    assert job.parent is not None and job.parent.span_id == campaign.get_span_context().span_id
    assert job.attributes is not None
    assert job.attributes["error.type"] == "RowsRejected"
    assert job.attributes["delayq.published"] == 18
    assert job.attributes["delayq.rejected"] == 2
    assert str(job.attributes["delayq.spark.job_group"]).startswith("delayq-schedule-")
    trace_id, job_id = f"0x{job.context.trace_id:032x}", f"0x{job.context.span_id:016x}"
    by_pid = read_spans(tmp_path)
    assert os.getpid() not in by_pid  # the driver used the application's provider
    publishes = [span for spans in by_pid.values() for span in spans]
    assert by_pid and all(spans for spans in by_pid.values())  # the executors' workers
    # One span per published row; the rejected rows were never messages, so no span.
    ids = {key_message_id(topology.namespace, f"row-{i}") for i in range(2, 20)}
    assert sorted(s["attributes"]["messaging.message.id"] for s in publishes) == sorted(ids)
    for span in publishes:
        assert span["kind"] == "SpanKind.PRODUCER"
        assert span["context"]["trace_id"] == trace_id
        assert span["parent_id"] == job_id
        assert span["status"]["status_code"] == "UNSET"
        attributes = span["attributes"]
        assert attributes["messaging.system"] == "rabbitmq"
        assert attributes["messaging.operation.type"] == "send"
        assert attributes["messaging.rabbitmq.destination.routing_key"] == "job.a"
        assert attributes["delayq.tier"] == "immediate"
    # Each message carries its own publish span's context: its consumer continues it.
    queue = topology.destinations[0].queue
    wait_for(lambda: depth(rabbitmq_url, queue) == 18, 30, "18 messages in the queue")
    headers = drain(rabbitmq_url, queue)
    span_of = {s["attributes"]["messaging.message.id"]: s["context"] for s in publishes}
    assert set(headers) == ids
    for message_id, carried in headers.items():
        _, trace_id, span_id, _ = carried["traceparent"].split("-")
        assert f"0x{trace_id}" == span_of[message_id]["trace_id"]
        assert f"0x{span_id}" == span_of[message_id]["span_id"]


def factory_of_a_module_only_here(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A provider factory of a module the driver imports and the executors' workers
    cannot (not on their path): pickled by reference, it cannot be loaded there."""
    name = f"only_here_{folder.name.replace('-', '_')}"
    (folder / f"{name}.py").write_text(
        "from tests.spark.test_tracing import span_files\n"
        f"make_provider = span_files(__import__('pathlib').Path({str(folder)!r}))\n"
        "def factory():\n    return make_provider()\n"
    )
    monkeypatch.syspath_prepend(str(folder))
    return __import__(name).factory


@pytest.mark.parametrize("broken", ["raises there", "cannot be loaded there"])
def test_a_factory_failing_on_the_executors_publishes_everything_untraced_said_once(
    broken: str,
    spark: Any,
    rabbitmq_url: str,
    make_topology: Callable[..., Topology],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    df = spark.createDataFrame(rows(12), SCHEMA)
    caplog.set_level(logging.WARNING, logger="delayq.tracing")
    if broken == "raises there":
        factory, cause = (
            span_files(tmp_path, fail_off=os.getpid()),
            "RuntimeError: no collector here",
        )
    else:
        factory, cause = factory_of_a_module_only_here(tmp_path, monkeypatch), "ModuleNotFoundError"

    summary = schedule(
        df, url=rabbitmq_url, topology=topology, delay_col="delay", partitions=2, tracing=factory
    )

    assert summary.total_published == 12 and summary.total_rejected == 0
    said = [r.getMessage() for r in caplog.records if r.name == "delayq.tracing"]
    assert len(said) == 1, said
    assert "2 task(s) published untraced" in said[0]
    assert cause in said[0]
    [job] = read_spans(tmp_path).pop(os.getpid())  # the driver's span, still there
    assert job["attributes"]["delayq.published"] == 12
    queue = topology.destinations[0].queue
    wait_for(lambda: depth(rabbitmq_url, queue) == 12, 30, "12 messages in the queue")
    headers = drain(rabbitmq_url, queue)
    assert len(headers) == 12
    assert not any("traceparent" in h for h in headers.values())


def test_tracing_must_be_a_factory_that_can_travel_refused_before_spark_runs(
    spark: Any,
    make_topology: Callable[..., Topology],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    topology = make_topology()
    df = spark.createDataFrame(rows(3), SCHEMA)
    stream = spark.readStream.format("rate").load()
    dead = "amqp://guest:guest@127.0.0.1:1/"  # checked after tracing= would be ConnectionFailed
    lock = threading.Lock()
    refused = {  # what tracing= got: what the error says
        "a-provider": "takes a function returning a TracerProvider",
        TracerProvider(): "Pass a function that builds one",
        True: "Pass a function that builds one",
        (lambda: lock): "cannot be sent to the executors",  # closes over a lock
    }
    for option, said in refused.items():
        with pytest.raises(InvalidInput, match="tracing") as caught:
            schedule(df, url=dead, topology=topology, delay_col="delay", tracing=option)  # type: ignore[arg-type]
        assert said in str(caught.value)
        with pytest.raises(InvalidInput, match="tracing") as caught:
            schedule_stream(
                stream,
                url=dead,
                topology=topology,
                checkpoint=str(tmp_path / "checkpoint"),
                delay_col="delay",
                tracing=option,  # type: ignore[arg-type]
            )
        assert said in str(caught.value)
    assert JobTracing.of(TracerProvider) is not None  # the class: a factory, if a bare one
    monkeypatch.setattr(tracing_module, "_TRACE", None)  # as if opentelemetry were missing
    with pytest.raises(MissingExtra, match=r"delayq\[otel\]"):
        schedule(df, url=dead, topology=topology, delay_col="delay", tracing=span_files(Path()))
    # tracing=False and None: no tracing, so the broker is what fails.
    for off in (None, False):
        with pytest.raises(ConnectionFailed):
            schedule(df, url=dead, topology=topology, delay_col="delay", tracing=off)


def test_each_micro_batch_of_a_stream_is_a_trace_of_its_own(
    spark: Any, rabbitmq_url: str, make_topology: Callable[..., Topology], tmp_path: Path
) -> None:
    topology = make_topology()
    apply_topology(topology, rabbitmq_url)
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text(
        "\n".join(
            json.dumps({"key": k, "routing_key": r, "delay": d, "body": b})
            for k, r, d, b in rows(6)
        )
    )
    spans = tmp_path / "spans"
    spans.mkdir()
    df = spark.readStream.schema(SCHEMA).json(str(source))

    running = schedule_stream(
        df,
        url=rabbitmq_url,
        topology=topology,
        checkpoint=str(tmp_path / "checkpoint"),
        delay_col="delay",
        partitions=2,
        trigger="available-now",
        tracing=span_files(spans),
    )
    assert running.await_termination(120)

    [batch] = running.batches
    assert batch.summary.total_published == 6
    by_pid = read_spans(spans)
    [job] = by_pid.pop(os.getpid())
    assert job["name"] == f"schedule {topology.namespace}"
    assert job["attributes"]["delayq.batch_id"] == batch.batch_id
    publishes = [span for found in by_pid.values() for span in found]
    assert len(publishes) == 6
    assert {s["parent_id"] for s in publishes} == {job["context"]["span_id"]}
    assert {s["context"]["trace_id"] for s in publishes} == {job["context"]["trace_id"]}
