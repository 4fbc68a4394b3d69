"""``delayq.local.ports.free_port``: below the kernel's ephemeral range where it can."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from delayq.local import ports
from delayq.local.ports import LOWEST_PORT, free_port, port_free


def test_a_port_is_picked_below_the_ephemeral_range_and_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("32768\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    picked = [free_port() for _ in range(200)]
    assert all(LOWEST_PORT <= port < 32768 for port in picked), picked
    assert all(port_free(port) for port in picked[:20])
    assert len(set(picked)) > 150  # random, not a sequence every process repeats


def test_a_port_bound_now_is_never_picked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "range").write_text(f"{LOWEST_PORT + 1_000} 60999")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    held = []
    try:
        for port in range(LOWEST_PORT, LOWEST_PORT + 1_000, 2):  # every other port taken
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()  # somebody else's already: taken too
                continue
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        for _ in range(100):
            assert free_port() not in taken
    finally:
        for sock in held:
            sock.close()


def test_the_random_modules_seed_does_not_choose_the_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Test runners seed `random` alike in every worker: their nodes' ports must differ.
    import random

    (tmp_path / "range").write_text("32768 60999")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    random.seed(1)
    first = [free_port() for _ in range(5)]
    random.seed(1)
    assert [free_port() for _ in range(5)] != first


@pytest.mark.parametrize("content", [None, "", "junk", "10500 60999"])
def test_without_a_range_with_room_the_kernel_picks(
    content: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "range"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", path)
    monkeypatch.setattr(ports, "port_free", lambda port: pytest.fail("picked below the range"))
    port = free_port()
    assert 0 < port < 65536 and port_free(port)


def test_when_no_pick_binds_the_kernel_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("32768 60999")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    tried: list[int] = []
    monkeypatch.setattr(ports, "_GIVEN", set())  # none handed out yet: each pick is tried
    monkeypatch.setattr(ports, "port_free", lambda port: tried.append(port) or False)
    port = free_port()
    assert len(tried) == 100 and port_free(port)


def test_a_port_is_handed_out_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Free when picked is not reserved: a cluster's twelve ports are picked before any
    node binds, and one run drew the same one twice (the node failed, eaddrinuse)."""
    (tmp_path / "range").write_text(f"{LOWEST_PORT + 1_000} 60999")  # 1,000 to pick from
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "range")
    picked = [free_port() for _ in range(600)]
    assert len(set(picked)) == len(picked)
