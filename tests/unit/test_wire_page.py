"""What docs/reference/wire.md says about names and header types, pinned: each tier
label the page shows is the name delayq forms, and each integer type it lists is read
as the number by both consumers' header decoders, by a delivery's attempt and by an
intake's ``x-delay`` (issue 48)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from delayq import Topology
from delayq.consume.delivery import Delivery
from delayq.intake import read_delay
from delayq.message.decoding import field_table
from delayq.message.envelope import H_ATTEMPT
from delayq.sync._headers import pika_table

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "wire.md"
LABELS = re.findall(r"^\| `([^`]+)` \| (\d+) ms \| `ns\.tier\.([^`]+)` \|$", PAGE.read_text(), re.M)
TYPES = {"b": ">b", "B": ">B", "s": ">h", "u": ">H", "I": ">i", "i": ">I", "l": ">q"}


def test_the_page_shows_the_labels_the_issue_asked_for() -> None:
    shown = {said: label for said, _ms, label in LABELS}
    assert {"60s": "1m", "90m": "1h30m", "1d": "24h"}.items() <= shown.items()


@pytest.mark.parametrize(("said", "ttl_ms", "label"), LABELS)
def test_a_tier_label_is_the_name_delayq_forms(said: str, ttl_ms: str, label: str) -> None:
    topology = Topology(namespace="ns", ladder=[said])
    (tier,) = topology.ladder.tiers
    assert tier.ttl_ms == int(ttl_ms)
    assert topology.tier_name(tier) == f"ns.tier.{label}"


def _listed_types() -> list[str]:
    found = re.search(r"\*\*Integer types\.\*\*(.*?)\(signed and unsigned", PAGE.read_text(), re.S)
    assert found, "wire.md: no **Integer types.** paragraph"
    return re.findall(r"`(\w)`", found.group(1))


def test_the_page_lists_the_integer_types_tested_here() -> None:
    assert _listed_types() == list(TYPES)


@pytest.mark.parametrize("kind", list(TYPES))
def test_an_integer_header_of_each_listed_type_is_read_as_its_number(kind: str) -> None:
    value = 100
    pairs = b""
    for key in (H_ATTEMPT, "x-delay"):
        pairs += bytes([len(key)]) + key.encode() + kind.encode() + struct.pack(TYPES[kind], value)
    data = struct.pack(">I", len(pairs)) + pairs
    for decode in (field_table, pika_table):
        headers, end = decode(data, 0)
        assert end == len(data)
        assert headers == {H_ATTEMPT: value, "x-delay": value}, decode.__name__
        assert Delivery("q", b"", "k", "m", None, headers).attempt == value
        assert read_delay(headers) == value
