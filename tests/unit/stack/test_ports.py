"""Choosing the loopback ports the stack's components listen on."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from neuron_dra_cli.stack import process


def _ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    ports = [process.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 <= p < _ephemeral_start() for p in ports)


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        # Offer the busy port first; the chooser must move on to the next candidate.
        offers = iter([taken, 23_456, 23_457, 23_458])
        monkeypatch.setattr(process, "_EPHEMERAL_RANGE", Path("/nonexistent"))
        monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, lo, hi: next(offers))
        monkeypatch.setattr(process, "_handed_out", set())
        port = process.free_port()
    assert port != taken
    assert port in (23_456, 23_457, 23_458)


def test_a_machine_without_room_below_the_ephemeral_range_gets_a_kernel_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("10200\t60999\n")
    monkeypatch.setattr(process, "_EPHEMERAL_RANGE", narrow)
    port = process.free_port()
    assert port >= _ephemeral_start()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
