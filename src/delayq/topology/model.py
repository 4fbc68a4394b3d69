"""The topology as data: a frozen pydantic model, loaded from YAML.

>>> topo = Topology(namespace="shop", ladder=["1s", "5s"],
...                 destinations=[{"queue": "emails", "bindings": ["email.*"]}])
>>> topo.tier_name(topo.ladder.tiers[0])
'shop.tier.1s'
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Annotated, Any, cast

import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from delayq.durations import format_ms, to_ms
from delayq.errors import InvalidDelay, InvalidTopology
from delayq.message.limits import DEFAULT_LIMITS, MessageLimits
from delayq.topology._validation import (
    MAX_NAME_BYTES,
    Model,
    check_alphabet,
    check_binding_keys,
    problems,
    shown,
)
from delayq.topology.cascade import MAX_LEVELS, Strategy, default_levels, key_overhead
from delayq.topology.default_file import DEFAULT_TOPOLOGY_FILE
from delayq.topology.destination import Destination
from delayq.topology.headers import check_header_routing
from delayq.topology.intakes import Intake, check_intakes
from delayq.topology.ladder import DEFAULT_LADDER, MAX_TIER_MS, Ladder, Tier
from delayq.topology.marker import digest, marker_name
from delayq.topology.shards import check_shards, shard_names

__all__ = [
    "DEFAULT_TOPOLOGY_FILE",
    "Destination",
    "ExactSettings",
    "QueueType",
    "Strategy",
    "Topology",
    "load_topology",
]



class QueueType(str, enum.Enum):
    """The kind of queue delayq declares."""

    QUORUM = "quorum"
    """Replicated, at-least-once dead-lettering: the only safe choice in production."""
    CLASSIC = "classic"
    """Development only: classic dead-lettering is at-most-once and can lose messages."""


def _parse_ladder(value: object) -> Ladder:
    if isinstance(value, Ladder):
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError('ladder must be a list of durations, for example ["30s", "1m", "5m"]')
    return Ladder.parse(value)


LadderField = Annotated[
    Ladder,
    BeforeValidator(_parse_ladder),
    PlainSerializer(lambda ladder: [t.label for t in ladder.tiers], return_type=list),
]


def _parse_unit(value: object) -> int:
    # No int shortcut: `unit: 250` has no unit (a dumped topology holds "250ms").
    try:
        return to_ms(value, what="exact.unit")
    except InvalidDelay as exc:
        raise ValueError(str(exc)) from None


class ExactSettings(Model):
    """The exact strategy's cascade: ``levels`` levels, level ``k`` waiting ``2**k`` units."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    unit_ms: Annotated[
        int,
        BeforeValidator(_parse_unit),
        PlainSerializer(format_ms, return_type=str),
        Field(ge=1, alias="unit"),
    ] = 1000
    """The precision: delays are rounded up to whole units (``unit: 250ms``)."""
    levels: int | None = Field(default=None, ge=1, le=MAX_LEVELS)
    """``None``: enough for the ladder's largest tier."""


class Topology(Model):
    """Namespace, ladder, queue type, destination queues, and message size limits."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    namespace: str = "delayq"
    vhost: str = "/"
    queue_type: QueueType = QueueType.QUORUM
    ladder: LadderField = DEFAULT_LADDER
    destinations: tuple[Destination, ...] = ()
    tier_max_length: int | None = Field(default=None, ge=1)
    """A cap on each tier queue's depth (``x-max-length``). With ``reject-publish``
    (quorum queues) a publish into a full tier is nacked: the publisher raises
    ``PublishRejected`` and nothing is half-published. ``None``: no cap."""
    limits: MessageLimits = DEFAULT_LIMITS
    """Body and header sizes checked before every publish (see :mod:`delayq.message.limits`)."""

    @property
    def declared_vhost(self) -> str | None:
        """:attr:`vhost` when the topology names it, else ``None`` (then whatever vhost the
        URL connects to is the topology's): what :func:`delayq.urls.check_vhost` checks."""
        return self.vhost if "vhost" in self.model_fields_set else None

    strategy: Strategy = Strategy.TIERED
    """The default strategy of publishes and of consumers' retries."""
    exact: ExactSettings | None = None
    """The exact strategy's cascade; declared when set or when ``strategy`` is exact."""
    shards: Annotated[int, BeforeValidator(check_shards)] = 1
    """Queues per tier and per retry tier, a message's chosen by a hash of its id
    (see :mod:`delayq.topology.shards`); 1 declares the unsharded names."""
    external_bindings: tuple[str, ...] = ()
    """Binding keys of queues bound to ``<ns>.ready`` outside this topology. A publish
    whose routing key matches neither a destination's bindings nor these raises
    :class:`~delayq.errors.UnboundRoutingKey` before anything is sent (it could only
    be parked in ``<ns>.unrouted`` when due); ``["#"]`` accepts every key."""
    intakes: tuple[Intake, ...] = ()
    """Exchanges plugin-style publishers publish to with ``x-delay`` headers, which
    ``delayq bridge`` schedules (see :mod:`delayq.topology.intakes`)."""

    @field_validator("external_bindings")
    @classmethod
    def _external_bindings(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_binding_keys(value)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return check_alphabet(value, "namespace")  # its length: _names_fit

    @model_validator(mode="after")
    def _unique_queues(self) -> Topology:
        seen: set[str] = set()
        reserved = {
            self.ready_exchange,
            self.unrouted,
            self.delivery_exchange,
            self.direct_exchange,
            self.headers_exchange,
        }
        for dest in self.destinations:
            if dest.queue in seen:
                raise ValueError(f"destination queue {dest.queue!r} is listed twice")
            if dest.queue in reserved or dest.queue.startswith(
                (
                    f"{self.namespace}.tier.",
                    f"{self.namespace}.retry.",
                    f"{self.namespace}.level.",
                    f"{self.namespace}.intake.",
                )
            ):
                raise ValueError(f"destination queue {dest.queue!r} uses a name delayq reserves")
            seen.add(dest.queue)
        if self.exact_enabled:
            self._check_cascade()
        self._names_fit()
        check_header_routing(self)
        check_intakes(self)
        return self

    def _names_fit(self) -> None:
        """Every name formed from the namespace fits RabbitMQ's 255 bytes: the longest
        depends on the ladder's labels, the shards and the levels (a probe of
        ``topology verify``, ``<ns>.verify.<8 hex>``, is shorter than the marker)."""
        names = [marker_name(self.namespace, digest(())), self.unrouted, self.delivery_exchange]
        for tier in self.ladder.tiers:
            names += [self.tier_shards(tier)[-1], self.retry_shards(tier)[-1]]
        if self.exact_enabled:
            names.append(self.level_name(self.exact_levels - 1))
        longest = max(names, key=lambda name: len(name.encode("utf-8")))
        size, added = len(self.namespace.encode("utf-8")), longest[len(self.namespace) :]
        room = MAX_NAME_BYTES - len(added.encode("utf-8"))
        if size > room:
            raise ValueError(
                f"namespace {shown(self.namespace)} is {size} bytes long; this topology "
                f"allows at most {room} bytes: the longest name delayq forms from it adds "
                f"{added!r} ({len(added.encode('utf-8'))} bytes), and RabbitMQ takes names "
                f"of up to {MAX_NAME_BYTES} bytes"
            )

    def _check_cascade(self) -> None:
        levels, unit_ms = self.exact_levels, self.exact_unit_ms
        if unit_ms * 2 ** (levels - 1) > MAX_TIER_MS:
            raise ValueError(
                f"exact: level {levels - 1} would wait {format_ms(unit_ms * 2 ** (levels - 1))}, "
                f"longer than the maximum TTL {format_ms(MAX_TIER_MS)}; use fewer levels"
            )
        room = 255 - key_overhead(levels)
        for dest in self.destinations:
            if len(dest.queue.encode()) > room:
                raise ValueError(
                    f"exact: queue name {shown(dest.queue)} is {len(dest.queue.encode())} "
                    f"bytes long, more than the {room} bytes a cascade key of {levels} levels "
                    f"leaves (255 - {key_overhead(levels)})"
                )

    # Entity names -------------------------------------------------------------

    @property
    def ready_exchange(self) -> str:
        """Where due and immediate messages are routed; destination queues bind here."""
        return f"{self.namespace}.ready"

    @property
    def unrouted(self) -> str:
        """Exchange and queue that park due messages no binding wanted."""
        return f"{self.namespace}.unrouted"

    @property
    def headers_exchange(self) -> str:
        """A headers exchange bound from the ready exchange with ``#``, where destinations
        bind x-match tables; declared when :attr:`routes_by_headers`."""
        return f"{self.namespace}.headers"

    @property
    def routes_by_headers(self) -> bool:
        """A headers intake, or a destination with ``headers``: due messages are routed by
        their headers (see :mod:`delayq.topology.headers`)."""
        return any(i.type == "headers" for i in self.intakes) or any(
            d.headers for d in self.destinations
        )

    @property
    def direct_exchange(self) -> str:
        """A direct exchange where each destination queue and each DLQ is bound by its own
        name: consumers send immediate retries and dead letters through it, so they need
        no write permission on the default exchange (which reaches every queue of the
        vhost, other namespaces' included)."""
        return f"{self.namespace}.direct"

    def tier_name(self, tier: Tier) -> str:
        """Name of a tier's exchange and queue, which carries its TTL."""
        return f"{self.namespace}.tier.{tier.label}"

    def retry_name(self, tier: Tier) -> str:
        """Name of a fanout retry tier's exchange and queue (dead-letters through the
        default exchange): what consumers before delayq's least-privilege grant used;
        still declared for them. Consumers now use :meth:`retry_direct_name`."""
        return f"{self.namespace}.retry.{tier.label}"

    def retry_direct_name(self, tier: Tier) -> str:
        """Name of a retry tier's direct exchange and queue: the exchange routes only the
        topology's destination queue names (each binds by its name), and the queue
        dead-letters through :attr:`direct_exchange`, back to the failing queue alone.
        Neither can reach another namespace's queue (see :mod:`delayq.ops.grant`)."""
        return f"{self.retry_name(tier)}.direct"

    def tier_shards(self, tier: Tier) -> tuple[str, ...]:
        """The names of a tier's shards: :meth:`tier_name` first (see ``shards``)."""
        return shard_names(self.tier_name(tier), self.shards)

    def retry_shards(self, tier: Tier) -> tuple[str, ...]:
        """The names of a retry tier's shards: :meth:`retry_direct_name` first."""
        return shard_names(self.retry_direct_name(tier), self.shards)

    @property
    def exact_enabled(self) -> bool:
        """Whether the exact strategy's levels are part of the topology."""
        return self.exact is not None or self.strategy is Strategy.EXACT

    @property
    def exact_unit_ms(self) -> int:
        return 1000 if self.exact is None else self.exact.unit_ms

    @property
    def exact_levels(self) -> int:
        """N: explicit, or enough levels for the ladder's largest tier (at most 28)."""
        if self.exact is not None and self.exact.levels is not None:
            return self.exact.levels
        return default_levels(self.ladder.max_ms, self.exact_unit_ms)

    @property
    def delivery_exchange(self) -> str:
        """Where level 0 dead-letters: ``<ns>.ready`` semantics for cascade keys."""
        return f"{self.namespace}.delivery"

    def level_name(self, level: int) -> str:
        """Name of a cascade level's exchange and queue (TTL ``2**level`` units)."""
        return f"{self.namespace}.level.{level}"

    def with_namespace(self, namespace: str) -> Topology:
        """A copy under another namespace (tests and demos use unique ones)."""
        return Topology.model_validate({**self.model_dump(), "namespace": namespace})

    @property
    def binding_keys(self) -> tuple[str, ...]:
        """Every binding key on ``<ns>.ready``: the destinations' and ``external_bindings``;
        ``#`` (the headers exchange's) when :attr:`routes_by_headers`."""
        if self.routes_by_headers:
            return ("#",)
        keys = [key for dest in self.destinations for key in dest.bindings]
        return tuple(dict.fromkeys([*keys, *self.external_bindings]))

    def destination(self, queue: str) -> Destination:
        for dest in self.destinations:
            if dest.queue == queue:
                return dest
        raise KeyError(queue)

    # Loading ------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "topology") -> Topology:
        """Validate a mapping, raising :class:`~delayq.errors.InvalidTopology`."""
        try:
            return cast(Topology, cls.__pydantic_validator__.validate_python(dict(data)))
        except ValidationError as exc:
            raise InvalidTopology(problems(source, exc)) from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys and drops the first without a word: a
    second ``destinations:`` would silently replace the first list. Refuse it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` then an override of a merged key is fine
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader refuses it below, with its own words
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} appears twice (lines {seen[key]} and {line}); YAML would "
                    "keep only the last one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_topology(path: str | Path = DEFAULT_TOPOLOGY_FILE) -> Topology:
    """Load and validate a topology YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise InvalidTopology(
            f"topology file {str(path)!r} does not exist; pass --file or create it "
            "(see topology/delayq.yaml in the delayq repository)"
        ) from exc
    except UnicodeDecodeError as exc:
        raise InvalidTopology(f"topology file {str(path)!r} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise InvalidTopology(f"cannot read topology file {str(path)!r}: {exc}") from exc
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise InvalidTopology(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidTopology(f"{path}: the top level must be a mapping, not {type(data).__name__}")
    return Topology.from_mapping(data, source=str(path))
