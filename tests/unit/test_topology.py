"""The topology model and loading it from YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from delayq.errors import InvalidTopology
from delayq.topology.ladder import DEFAULT_LADDER, Ladder
from delayq.topology.model import Destination, QueueType, Topology, load_topology

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO_TOPOLOGY = REPO_ROOT / "topology" / "delayq.yaml"


def topo(**fields: Any) -> Topology:
    """A topology from a mapping, through the same path files take."""
    return Topology.from_mapping(fields)


def dest(queue: str = "orders", bindings: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"queue": queue, "bindings": bindings or ["orders.created"], **extra}


# --- defaults ------------------------------------------------------------------------------------


def test_defaults() -> None:
    t = Topology()
    assert t.namespace == "delayq"
    assert t.vhost == "/"
    assert t.queue_type is QueueType.QUORUM
    assert t.ladder == DEFAULT_LADDER
    assert t.destinations == ()


def test_entity_names_carry_the_namespace() -> None:
    t = topo(namespace="shop", ladder=["5m"])
    assert t.ready_exchange == "shop.ready"
    assert t.unrouted == "shop.unrouted"
    assert t.tier_name(t.ladder.tiers[0]) == "shop.tier.5m"


def test_destination_dlq_name() -> None:
    assert Destination(queue="orders", bindings=("a",)).dlq == "orders.dlq"


def test_destination_delivery_limit_default() -> None:
    assert Destination(queue="orders", bindings=("a",)).delivery_limit == 20


def test_topology_is_frozen() -> None:
    with pytest.raises(ValidationError):
        Topology().namespace = "other"


def test_ladder_given_as_ladder_object() -> None:
    assert Topology(ladder=Ladder([1_000])).ladder == Ladder([1_000])


def test_destination_lookup() -> None:
    t = topo(destinations=[dest("a", ["a"]), dest("b", ["b"])])
    assert t.destination("b").queue == "b"
    with pytest.raises(KeyError):
        t.destination("c")


def test_with_namespace_keeps_everything_else() -> None:
    t = topo(namespace="one", ladder=["1s", "1h30m"], queue_type="classic", destinations=[dest()])
    other = t.with_namespace("two")
    assert other.namespace == "two"
    assert other.ladder == t.ladder
    assert other.queue_type is QueueType.CLASSIC
    assert other.destinations == t.destinations


def test_with_namespace_validates_the_new_name() -> None:
    with pytest.raises(ValueError):
        Topology().with_namespace("bad name")


# --- namespace -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "shop", "Shop-1", "my_app.v2", "0ns"])
def test_good_namespaces(name: str) -> None:
    assert topo(namespace=name).namespace == name


@pytest.mark.parametrize(
    "name",
    ["", ".shop", "-shop", "_shop", "my shop", "shop/1", "shop*", "shop#", "sh\u00f6p", "a" * 235],
    ids=repr,
)
def test_bad_namespaces(name: str) -> None:
    with pytest.raises(InvalidTopology, match="namespace"):
        topo(namespace=name)


def test_namespace_of_234_bytes_is_accepted() -> None:
    # the longest name it forms, '<ns>.applied.<12 hex>' (the apply marker), is 255 bytes
    assert len(topo(namespace="a" * 234).namespace) == 234


def test_namespace_must_be_a_string() -> None:
    with pytest.raises(InvalidTopology, match="namespace"):
        topo(namespace=123)


def test_namespace_amq_is_reserved_by_rabbitmq() -> None:
    # RabbitMQ refuses (403 ACCESS_REFUSED) exchanges and queues named "amq.*":
    # namespace "amq" would make "amq.ready", "amq.tier.30s", ...
    with pytest.raises(InvalidTopology, match="namespace"):
        topo(namespace="amq")


# --- queue names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("queue", ["orders", "orders.reminders", "Q-1_x", "9"])
def test_good_queue_names(queue: str) -> None:
    assert topo(destinations=[dest(queue)]).destinations[0].queue == queue


@pytest.mark.parametrize("queue", ["", " orders", "orders!", ".orders", "a b", "a" * 252], ids=repr)
def test_bad_queue_names(queue: str) -> None:
    with pytest.raises(InvalidTopology, match="queue name"):
        topo(destinations=[dest(queue)])


def test_queue_name_ending_in_dlq_is_reserved() -> None:
    with pytest.raises(InvalidTopology, match=r"\.dlq"):
        topo(destinations=[dest("orders.dlq")])


def test_queue_name_starting_with_amq_is_reserved_by_rabbitmq() -> None:
    with pytest.raises(InvalidTopology, match="amq"):
        topo(destinations=[dest("amq.orders")])


def test_duplicate_destination_queue() -> None:
    with pytest.raises(InvalidTopology, match="listed twice"):
        topo(destinations=[dest("orders", ["a"]), dest("orders", ["b"])])


@pytest.mark.parametrize("queue", ["shop.ready", "shop.unrouted", "shop.tier.30s", "shop.tier.x"])
def test_destination_queue_cannot_take_a_reserved_name(queue: str) -> None:
    with pytest.raises(InvalidTopology, match="reserves"):
        topo(namespace="shop", destinations=[dest(queue)])


def test_reserved_names_follow_the_namespace() -> None:
    t = topo(namespace="shop", destinations=[dest("delayq.ready")])
    assert t.destinations[0].queue == "delayq.ready"


# --- binding keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["orders", "orders.created", "orders.*", "orders.#", "#", "*", "*.created", "a.*.#", "A-b_1.c"],
)
def test_good_binding_keys(key: str) -> None:
    assert topo(destinations=[dest(bindings=[key])]).destinations[0].bindings == (key,)


@pytest.mark.parametrize(
    "key",
    [
        "",
        ".",
        "orders.",
        ".orders",
        "orders..created",
        "orders*",
        "or#ders",
        "a b",
        "a/b",
        "a" * 256,
    ],
    ids=repr,
)
def test_bad_binding_keys(key: str) -> None:
    with pytest.raises(InvalidTopology, match="binding key"):
        topo(destinations=[dest(bindings=[key])])


def test_binding_key_of_255_bytes_is_accepted() -> None:
    key = "a" * 255
    assert topo(destinations=[dest(bindings=[key])]).destinations[0].bindings == (key,)


def test_bindings_must_not_be_empty() -> None:
    with pytest.raises(InvalidTopology, match="bindings"):
        topo(destinations=[{"queue": "orders", "bindings": []}])


def test_bindings_are_required() -> None:
    with pytest.raises(InvalidTopology, match="bindings"):
        topo(destinations=[{"queue": "orders"}])


def test_duplicate_binding_keys() -> None:
    with pytest.raises(InvalidTopology, match="unique"):
        topo(destinations=[dest(bindings=["a.b", "a.b"])])


# --- delivery limit ------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, 1001])
def test_delivery_limit_out_of_range(limit: int) -> None:
    with pytest.raises(InvalidTopology, match="delivery_limit"):
        topo(destinations=[dest(delivery_limit=limit)])


@pytest.mark.parametrize("limit", [1, 1000])
def test_delivery_limit_bounds_are_accepted(limit: int) -> None:
    assert topo(destinations=[dest(delivery_limit=limit)]).destinations[0].delivery_limit == limit


# --- queue type, ladder, extra keys --------------------------------------------------------------


def test_classic_queue_type() -> None:
    assert topo(queue_type="classic").queue_type is QueueType.CLASSIC


@pytest.mark.parametrize("value", ["stream", "Quorum", "", 1])
def test_unknown_queue_type(value: object) -> None:
    with pytest.raises(InvalidTopology, match="queue_type"):
        topo(queue_type=value)


def test_ladder_from_strings() -> None:
    assert topo(ladder=["5s", "1s"]).ladder == Ladder([1_000, 5_000])


@pytest.mark.parametrize("ladder", ["30s", 30, {"a": "30s"}, None], ids=repr)
def test_ladder_must_be_a_list(ladder: object) -> None:
    with pytest.raises(InvalidTopology, match="ladder"):
        topo(ladder=ladder)


@pytest.mark.parametrize("ladder", [[], ["30s", "30s"], ["0s"], ["abc"], [30], ["30d"]], ids=repr)
def test_bad_ladders(ladder: object) -> None:
    with pytest.raises(InvalidTopology, match="ladder"):
        topo(ladder=ladder)


def test_unknown_top_level_key() -> None:
    with pytest.raises(InvalidTopology, match="nmespace"):
        topo(nmespace="shop")


def test_unknown_destination_key() -> None:
    with pytest.raises(InvalidTopology, match=r"destinations\.0\.binding: Extra inputs"):
        topo(destinations=[{"queue": "orders", "binding": ["a"], "bindings": ["a"]}])


def test_from_mapping_message_names_the_source() -> None:
    with pytest.raises(InvalidTopology, match=r"^my-file\.yaml: "):
        Topology.from_mapping({"namespace": ""}, source="my-file.yaml")


def test_from_mapping_chains_the_validation_error() -> None:
    with pytest.raises(InvalidTopology) as info:
        topo(namespace="")
    assert isinstance(info.value.__cause__, ValidationError)


# --- load_topology -------------------------------------------------------------------------------


GOOD_YAML = """\
namespace: shop
vhost: /shop
queue_type: classic
ladder: [1s, 10s, 1m]
destinations:
  - queue: emails
    bindings: [email.*, "email.#"]
    delivery_limit: 5
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "delayq.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_load_good_file(tmp_path: Path) -> None:
    t = load_topology(write(tmp_path, GOOD_YAML))
    assert t.namespace == "shop"
    assert t.vhost == "/shop"
    assert t.queue_type is QueueType.CLASSIC
    assert [tier.label for tier in t.ladder] == ["1s", "10s", "1m"]
    assert t.destinations == (
        Destination(queue="emails", bindings=("email.*", "email.#"), delivery_limit=5),
    )


def test_load_accepts_a_str_path(tmp_path: Path) -> None:
    assert load_topology(str(write(tmp_path, GOOD_YAML))).namespace == "shop"


def test_load_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert load_topology(write(tmp_path, "")) == Topology()


def test_load_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InvalidTopology, match="does not exist") as info:
        load_topology(missing)
    assert str(missing) in str(info.value)


def test_load_a_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopology, match="cannot read"):
        load_topology(tmp_path)


def test_load_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopology, match="not valid YAML"):
        load_topology(write(tmp_path, "namespace: [shop\n"))


def test_load_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "delayq.yaml"
    path.write_bytes(b"namespace: \xff\xfe\n")
    with pytest.raises(InvalidTopology):
        load_topology(path)


@pytest.mark.parametrize(
    ("text", "type_name"), [("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int")]
)
def test_load_top_level_not_a_mapping(tmp_path: Path, text: str, type_name: str) -> None:
    with pytest.raises(InvalidTopology, match=f"top level must be a mapping, not {type_name}"):
        load_topology(write(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("namespace: 42\n", "namespace"),
        ("ladder: 30s\n", "ladder"),
        ("ladder: [30, 60]\n", "ladder"),
        ("destinations: {queue: a}\n", "destinations"),
        (
            "destinations:\n  - queue: a\n    bindings: [a]\n    delivery_limit: many\n",
            "destinations.0.delivery_limit",
        ),
        ("queue_type: fast\n", "queue_type"),
        ("namespaces: shop\n", "namespaces"),
    ],
)
def test_load_wrong_types(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidTopology) as info:
        load_topology(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert field in message


def test_load_error_lists_every_problem(tmp_path: Path) -> None:
    with pytest.raises(InvalidTopology) as info:
        load_topology(write(tmp_path, "namespace: ''\nqueue_type: fast\n"))
    assert "namespace" in str(info.value)
    assert "queue_type" in str(info.value)


# --- the repository's own topology file ----------------------------------------------------------


def test_repository_topology_file_loads() -> None:
    t = load_topology(REPO_TOPOLOGY)
    assert t.namespace == "delayq"
    assert t.queue_type is QueueType.QUORUM


def test_repository_topology_uses_the_default_ladder() -> None:
    assert load_topology(REPO_TOPOLOGY).ladder == DEFAULT_LADDER


def test_load_topology_reads_topology_delayq_yaml_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    assert load_topology() == load_topology(REPO_TOPOLOGY)
