"""``delayq migrate plan``: a broker's delayed-message exchanges become delayq topologies.

Pure: it reads RabbitMQ definitions (``rabbitmqctl export_definitions``, or the
management API's ``/api/definitions``) and returns, for each exchange of type
``x-delayed-message`` in the vhost, a topology and the ordered cut-over steps.

Each plugin exchange ``E`` gets a namespace of its own, ``delayq.E``, with:

- an intake (:mod:`delayq.topology.intakes`) of ``E``'s ``x-delayed-type``, under a new
  exchange name, ``E.intake`` by default: while the plugin still holds delayed
  messages ``E`` must stay (deleting it deletes them), so publishers move to the new
  name (a configuration change) and ``E`` drains;
- a destination ``existing: true`` for each queue bound to ``E``, with its binding keys
  (a ``fanout`` exchange's: ``#``): delayq binds the queue, never declares or changes
  it, so its consumers go on as they are;
- ``external_bindings`` for each exchange bound to ``E`` (bound to ``delayq.E.ready``
  by hand: a step says how);
- a ladder: the default, or the best of 9 tiers for a sample of observed ``x-delay``
  values, its top still the default's (:mod:`delayq.ops.migrate_ladder`).

A ``headers`` exchange (``x-delayed-type: headers``) becomes a headers intake: each
queue bound to it a destination with ``headers``, one x-match table per binding (its
arguments), and each exchange bound to it a step to bind it to ``delayq.E.headers``
with the same arguments (:mod:`delayq.topology.headers`).

What cannot be reproduced is refused naming the entity: a binding with arguments on an
exchange of another type, a table delayq cannot bind (an ``x-match: any`` without keys,
a ``delayq-`` header), a direct binding key that a topic exchange would read as a
pattern. A binding with the empty key is left out with a warning (delayq schedules
nothing under it), the rest planned: the plan is then not complete
(:attr:`PlannedExchange.complete`). An exchange with no binding is planned with a
warning: its intake would park every message.
"""

from __future__ import annotations

import json
import re
import string
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delayq.durations import format_ms
from delayq.errors import InvalidBody, InvalidInput, InvalidTopology
from delayq.message.envelope import parse_json_body
from delayq.ops.migrate_ladder import PlannedLadder, default_ladder, fitted_ladder
from delayq.topology.ladder import MAX_TIER_MS
from delayq.topology.model import Topology
from delayq.wording import shortened

__all__ = [
    "PlannedExchange",
    "check_intake_name",
    "load_definitions",
    "plan_migration",
    "read_delays",
    "topology_file",
]

PLUGIN_TYPE = "x-delayed-message"

_DELAY = re.compile(r"[+-]?[0-9]+", re.ASCII)
"""An x-delay as the bridge reads one (:mod:`delayq.intake.delay`)."""


@dataclass(frozen=True)
class PlannedExchange:
    """One plugin exchange's topology and cut-over steps."""

    exchange: str
    topology: Topology
    steps: tuple[str, ...]
    ladder_note: str = ""
    """The ladder, and how late it delivers (the default's smallest tier, or the sample's
    lateness)."""
    warnings: tuple[str, ...] = ()
    """What the plan leaves out or cannot route; each is a step too."""
    left_out: tuple[str, ...] = ()
    """The bindings of the plugin exchange the topology does not reproduce."""

    @property
    def intake(self) -> str:
        return self.topology.intakes[0].exchange

    @property
    def complete(self) -> bool:
        """Every binding of the plugin exchange is reproduced."""
        return not self.left_out


def check_intake_name(template: str) -> None:
    """``template`` makes an intake's name from ``{exchange}``, the plugin exchange's
    name, and nothing else; raises :class:`~delayq.errors.InvalidInput` saying why not."""
    usage = (
        "the only placeholder is {exchange} (the plugin exchange's name), as in {exchange}.intake"
    )
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template)]
    except ValueError as exc:
        raise InvalidInput(f"--intake-name {template!r}: {exc}; {usage}") from None
    named = [(f, spec, conv) for f, spec, conv in fields if f is not None]
    for field, spec, conversion in named:
        if field != "exchange" or spec or conversion:
            shown = "{" + field + (f"!{conversion}" if conversion else "")
            shown += (f":{spec}" if spec else "") + "}"
            raise InvalidInput(f"--intake-name {template!r}: {shown} is not a placeholder; {usage}")
    if not named:
        raise InvalidInput(f"--intake-name {template!r} has no {{exchange}}; {usage}")


def topology_file(folder: str | Path, namespace: str) -> str:
    """Where the plan writes a namespace's topology, as its steps and warnings name it."""
    return str(Path(folder) / f"{namespace}.yaml")


def load_definitions(path: Path) -> dict[str, Any]:
    """A definitions file as a dict; a clear error for what is not one."""
    try:
        data = parse_json_body(path.read_text("utf-8"), f"definitions {str(path)!r}")
    except OSError as exc:
        raise InvalidInput(f"cannot read definitions {str(path)!r}: {exc.strerror}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"definitions {str(path)!r} are not JSON: {exc}") from exc
    except InvalidBody as exc:  # JSON, but too long a number or too deep for Python
        raise InvalidInput(str(exc)) from exc
    if not isinstance(data, dict) or not isinstance(data.get("exchanges", []), list):
        raise InvalidInput(
            f"definitions {str(path)!r} are not RabbitMQ definitions (an object with "
            "'exchanges' and 'bindings' lists: rabbitmqctl export_definitions)"
        )
    return data


def read_delays(path: Path) -> Counter[int]:
    """Observed ``x-delay`` values, in ms, one a line (``#`` comments, blank lines)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the delays sample {str(path)!r}: {exc}") from exc
    delays: Counter[int] = Counter()
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        # ASCII digits only, as the bridge reads an x-delay (str.isdigit() takes '٣٠٠٠')
        if _DELAY.fullmatch(line) is None:
            raise InvalidInput(
                f"{path}:{number}: {shortened(line)} is not a delay in milliseconds (an "
                "integer, digits 0-9)"
            )
        digits = line.lstrip("+-").lstrip("0")
        if line.startswith("-") or not digits:
            delays[0] += 1  # the plugin delivers a negative x-delay at once
            continue
        # int() of more than 4,300 digits raises ValueError; far fewer make no tier
        if len(digits) > len(str(MAX_TIER_MS)):
            raise InvalidInput(
                f"{path}:{number}: {shortened(line)} is longer than any tier delayq takes "
                f"(at most {MAX_TIER_MS} ms, {format_ms(MAX_TIER_MS)})"
            )
        delays[int(digits)] += 1
    if not any(ms > 0 for ms in delays):
        raise InvalidInput(f"the delays sample {str(path)!r} holds no positive delay")
    return delays


def plan_migration(
    definitions: Mapping[str, Any],
    *,
    vhost: str = "/",
    delays: Mapping[int, int] | None = None,
    intake_name: str = "{exchange}.intake",
    folder: str | Path = "topology",
) -> list[PlannedExchange]:
    """A topology and the cut-over steps for each plugin exchange of ``vhost``; the steps
    and warnings name its file as ``folder/<namespace>.yaml`` (where ``--out`` writes it)."""
    exchanges = [
        e
        for e in _entries(definitions, "exchanges")
        if e.get("type") == PLUGIN_TYPE and e.get("vhost", "/") == vhost
    ]
    if not exchanges:
        found = sorted({str(e.get("vhost", "/")) for e in _entries(definitions, "exchanges")
                        if e.get("type") == PLUGIN_TYPE})  # fmt: skip
        elsewhere = f" (there are some in vhost {', '.join(found)}: --vhost)" if found else ""
        raise InvalidInput(f"no {PLUGIN_TYPE} exchange in vhost {vhost!r}{elsewhere}")
    check_intake_name(intake_name)
    bindings = [b for b in _entries(definitions, "bindings") if b.get("vhost", "/") == vhost]
    ladder = fitted_ladder(delays) if delays else default_ladder()
    existing = {
        str(e.get("name", "")): str(e.get("type", ""))
        for e in _entries(definitions, "exchanges")
        if e.get("vhost", "/") == vhost
    }
    planned = []
    for exchange in exchanges:
        name = str(exchange.get("name", ""))
        intake = intake_name.format(exchange=name)
        if intake == name:
            raise InvalidInput(
                f"--intake-name {intake_name!r} gives exchange {name!r} its own name: the "
                "intake needs a new one, since the plugin exchange must stay until it has "
                "delivered what it holds (deleting it deletes them: 'Why a new exchange name' "
                "in the plugin migration guide)"
            )
        if intake in existing:
            raise InvalidInput(
                f"--intake-name {intake_name!r} gives exchange {name!r} the intake {intake!r}, "
                f"an exchange the vhost already has (type {existing[intake]}): choose another"
            )
        planned.append(_plan_one(exchange, bindings, vhost, ladder, intake, Path(folder)))
    return planned


def _entries(definitions: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    entries = definitions.get(key, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise InvalidInput(f"definitions: {key!r} must be a list of objects")
    return entries


def _plan_one(
    exchange: dict[str, Any],
    bindings: Iterable[dict[str, Any]],
    vhost: str,
    ladder: PlannedLadder,
    intake: str,
    folder: Path,
) -> PlannedExchange:
    name = str(exchange.get("name", ""))
    arguments = exchange.get("arguments") or {}
    kind = arguments.get("x-delayed-type")
    if kind is None:
        raise InvalidInput(f"exchange {name!r} has no x-delayed-type argument")
    queues: dict[str, list[str]] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    external: list[str] = []
    steps_bind: list[str] = []
    left_out: list[str] = []
    namespace = f"delayq.{name}"
    file = topology_file(folder, namespace)
    dlq = f"{namespace}.intake.{intake}.dlq"
    bound = 0
    for binding in bindings:
        if binding.get("source") != name:
            continue
        bound += 1
        where = f"binding {name!r} -> {binding.get('destination')!r}"
        if not isinstance(binding.get("destination"), str) or not binding["destination"]:
            raise InvalidInput(f"{where} names no destination: definitions incomplete")
        if kind == "headers":
            steps_bind += _headers_binding(binding, where, namespace, tables)
            continue
        if binding.get("arguments"):
            raise InvalidInput(
                f"{where} has arguments, which a {kind} exchange does not match on: "
                "not reproducible"
            )
        key = "#" if kind == "fanout" else str(binding.get("routing_key", ""))
        if not key:
            left_out.append(
                f"{where} (routing key '') is left out: delayq schedules nothing under the "
                f"empty key, so the intake parks such messages in {dlq}; have their "
                f"publishers send a key, and bind {binding['destination']!r} by it in "
                f"{file}"
            )
            continue
        if kind == "direct" and {"*", "#"} & set(key.split(".")):
            raise InvalidInput(
                f"{where} (direct) has key {key!r}, which delayq's topic ready exchange "
                "would read as a pattern"
            )
        if binding.get("destination_type", "queue") == "exchange":
            external.append(key)
            steps_bind.append(
                f"bind exchange {binding['destination']!r} to {namespace}.ready with routing "
                f"key {key!r} (management UI or API: delayq binds no exchange of yours)"
            )
        else:
            queues.setdefault(str(binding["destination"]), []).append(key)
    data: dict[str, Any] = {
        "namespace": namespace,
        "vhost": vhost,
        "destinations": [
            {"queue": queue, "bindings": sorted(set(keys)), "existing": True}
            for queue, keys in sorted(queues.items())
        ]
        + [
            {"queue": queue, "headers": _unique(found), "existing": True}
            for queue, found in sorted(tables.items())
        ],
        "external_bindings": sorted(set(external)),
        "intakes": [{"exchange": intake, "type": kind}],
        "ladder": ladder.labels,
    }
    try:
        topology = Topology.model_validate(data)
    except InvalidTopology as exc:
        raise InvalidInput(f"exchange {name!r} cannot become a delayq topology: {exc}") from exc
    warnings = list(left_out)
    if not (topology.destinations or steps_bind):
        parked = topology.unrouted if kind == "headers" else dlq
        how = "every binding it has is left out" if bound else "it has no binding"
        warnings.append(
            f"exchange {name!r}: {how}, so its intake has no destination and every message "
            f"published to it is parked in {parked} (the plugin dropped them): bind a queue "
            f"in {file}, or leave this exchange out"
        )
    steps = _steps(name, vhost, topology, file, steps_bind, warnings)
    return PlannedExchange(name, topology, steps, ladder.note, tuple(warnings), tuple(left_out))


def _headers_binding(
    binding: Mapping[str, Any],
    where: str,
    namespace: str,
    tables: dict[str, list[dict[str, Any]]],
) -> list[str]:
    """A binding of a headers plugin exchange: its arguments become an x-match table of
    the queue's (a destination with ``headers``), or, for an exchange, a step to bind it
    to the namespace's headers exchange by hand. The steps it adds."""
    arguments = binding.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise InvalidInput(f"{where} has arguments that are not an object: definitions broken")
    destination = str(binding["destination"])
    if binding.get("destination_type", "queue") == "exchange":
        return [
            f"bind exchange {destination!r} to {namespace}.headers with arguments "
            f"{json.dumps(arguments, sort_keys=True)} (management UI or API: delayq binds no "
            "exchange of yours)"
        ]
    tables.setdefault(destination, []).append(dict(arguments))
    return []


def _unique(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tables once each (two bindings of a queue with equal arguments are one binding)."""
    seen: dict[str, dict[str, Any]] = {}
    for table in tables:
        seen.setdefault(json.dumps(table, sort_keys=True), table)
    return list(seen.values())


def _steps(
    name: str, vhost: str, topology: Topology, file: str, binds: list[str], warnings: list[str]
) -> tuple[str, ...]:
    intake = topology.intakes[0].exchange
    largest = topology.ladder.tiers[-1].label
    quoted = urllib.parse.quote  # the default vhost '/' is %2F in a path
    path = f"/api/exchanges/{quoted(vhost, safe='')}/{quoted(name, safe='')}"
    return (
        f"delayq topology apply -f {file}   # tiers, the intake {intake!r}, bindings to "
        "your queues (none declared or changed)",
        *binds,
        f"delayq bridge -f {file}   # or worker.bridge() in your worker; it runs until "
        "stopped: keep it running under a supervisor that restarts it (systemd "
        "Restart=always, a container's restart policy)",
        f"delayq migrate check -f {file}   # applied, and every intake bridged",
        *(f"before moving publishers: {warning}" for warning in warnings),
        f"point the publishers at exchange {intake!r} instead of {name!r} (a configuration "
        "change: the same routing keys and x-delay headers), one by one",
        f"wait until {name!r} holds no delayed message: the plugin counts them as the "
        f"exchange's messages_delayed (GET {path}, or the management UI's exchange page); "
        "without the management plugin, wait the longest x-delay the publishers sent it "
        "from when the last one moved. Deleting it earlier deletes what the plugin still "
        f"holds (delayq's ladder tops out at {largest})",
        f"delete exchange {name!r} (the management UI, or DELETE {path}); the plugin can "
        "then be disabled",
    )
