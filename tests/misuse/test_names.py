"""Names in a topology and on the command line (issue 29, item 1).

An over-long name says its length in UTF-8 bytes and the limit, counting what delayq
adds to it to form entity names (RabbitMQ takes names of at most 255 bytes); a name
outside delayq's alphabet says which character and which alphabet: ASCII letters,
digits and . _ - (non-Latin letters included, they are refused by that rule, not as
"not letters").
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from delayq import InvalidRoutingKey, InvalidTopology, Topology
from delayq.cli import EXIT_INPUT, main
from delayq.message.validate import validate_routing_key

ALPHABET = "ASCII letters, digits and . _ -"


def dest(queue: str, bindings: tuple[str, ...] = ("job.#",)) -> dict[str, Any]:
    return {"queue": queue, "bindings": list(bindings)}


def refused(**kwargs: Any) -> str:
    with pytest.raises(InvalidTopology) as caught:
        Topology(**kwargs)
    return str(caught.value)


def test_an_over_long_queue_name_says_its_length_and_the_limit_not_letters() -> None:
    said = refused(destinations=[dest("q" * 256)])
    assert "is 256 bytes" in said and "at most 251 bytes" in said, said
    assert "'.dlq'" in said and "255" in said  # why 251: its DLQ's name
    assert "letters" not in said
    assert "q" * 100 not in said  # the name is shortened in the message


def test_a_queue_name_at_the_limit_is_accepted_and_one_byte_more_is_not() -> None:
    assert Topology(destinations=[dest("q" * 251)]).destinations[0].dlq == "q" * 251 + ".dlq"
    assert "is 252 bytes" in refused(destinations=[dest("q" * 252)])


def test_an_over_long_namespace_says_its_length_the_limit_and_the_name_it_would_make() -> None:
    said = refused(namespace="n" * 256)
    assert "is 256 bytes" in said and "at most 234 bytes" in said, said
    assert ".applied." in said and "255" in said  # the longest name delayq forms from it
    assert "letters" not in said


def test_the_namespace_limit_counts_what_this_topology_adds() -> None:
    # The default ladder: the apply marker '<ns>.applied.<12 hex>' adds the most (21 bytes).
    assert Topology(namespace="n" * 234).namespace == "n" * 234
    assert "is 235 bytes" in refused(namespace="n" * 235)
    # 64 shards of a 1h30m tier: '<ns>.retry.1h30m.direct.s63' adds 23 bytes.
    sharded: dict[str, Any] = {"ladder": ["1h30m"], "shards": 64}
    assert Topology(namespace="n" * 232, **sharded).shards == 64
    said = refused(namespace="n" * 233, **sharded)
    assert "at most 232 bytes" in said and ".retry.1h30m.direct.s63" in said, said


@pytest.mark.parametrize("name", ["заказы", "注文", "café"])
def test_a_non_latin_name_is_refused_naming_the_alphabet(name: str) -> None:
    for kwargs in ({"namespace": name}, {"destinations": [dest(name)]}):
        said = refused(**kwargs)
        assert ALPHABET in said, said
        first_bad = next(c for c in name if not c.isascii())
        assert repr(first_bad) in said, said


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("-orders", "must start with an ASCII letter or digit"),
        ("orders!", "'!'"),
        ("my orders", "' '"),
        ("", "is empty"),
    ],
    ids=repr,
)
def test_other_bad_names_say_what_is_wrong(name: str, says: str) -> None:
    said = refused(destinations=[dest(name)])
    assert says in said, said
    if name:
        assert ALPHABET in said, said


def test_an_over_long_binding_key_says_its_length() -> None:
    said = refused(destinations=[dest("orders", ("k" * 256,))])
    assert "is 256 bytes" in said and "at most 255" in said, said


def test_an_over_long_routing_key_counts_utf8_bytes_and_says_so() -> None:
    key = "з" * 128  # 128 characters, 256 bytes
    with pytest.raises(InvalidRoutingKey, match="is 256 bytes") as caught:
        validate_routing_key(key)
    assert "at most 255" in str(caught.value)
    assert validate_routing_key("з" * 127 + "a") == "з" * 127 + "a"  # 255 bytes


def _cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any], *argv: str):
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    capsys.readouterr()
    code = main([*argv, "--file", str(path)])
    return code, capsys.readouterr()


def test_the_cli_says_the_length_and_the_alphabet(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DELAYQ_URL", "amqp://guest:guest@127.0.0.1:1/")
    long_queue = {"namespace": "shop", "destinations": [dest("q" * 256)]}
    code, out = _cli(tmp_path, capsys, long_queue, "topology", "plan")
    assert code == EXIT_INPUT and "is 256 bytes" in out.err and "Traceback" not in out.err
    cyrillic = {"namespace": "shop", "destinations": [dest("заказы")]}
    code, out = _cli(tmp_path, capsys, cyrillic, "topology", "plan")
    assert code == EXIT_INPUT and ALPHABET in out.err, out.err
    good = {"namespace": "shop", "destinations": [dest("orders")]}
    code, out = _cli(tmp_path, capsys, good, "publish", "-k", "з" * 128, "-d", "1s")
    assert code == EXIT_INPUT and "routing key is 256 bytes" in out.err, out.err


def test_names_at_the_limits_are_declared_by_rabbitmq(rabbitmq_url: str) -> None:
    """What the validator lets through, RabbitMQ takes: a namespace whose longest name is
    255 bytes, and a queue whose DLQ's name is."""
    from delayq.sync import apply_topology, delete_topology

    unique = f"t{uuid.uuid4().hex[:8]}"
    namespace = unique + "n" * (234 - len(unique))
    queue = unique + "q" * (251 - len(unique))
    topology = Topology(namespace=namespace, ladder=["1s"], destinations=[dest(queue)])
    try:
        report = apply_topology(topology, rabbitmq_url)
        assert report.ok, report.summary()
    finally:
        delete_topology(topology, rabbitmq_url)
