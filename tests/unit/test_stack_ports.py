"""The stack's ports: drawn where no outgoing connection takes one, and a server that exits before it listens is
reported at once with its exit, not after the wait."""

import socket
import subprocess
import sys

import pytest

from services.stack import processes
from services.stack.processes import free_ports_at, outgoing_port_range, wait_for_port


def test_ports_are_drawn_below_the_range_outgoing_connections_take_theirs_from():
    low, _ = outgoing_port_range()
    if low - 12 <= 10_000:
        pytest.skip(f"the kernel's outgoing range starts at {low}: no room below it")
    for _ in range(20):
        base = free_ports_at(0, 1, 2, 10, 11, 12)
        assert base >= 10_000 and base + 12 < low


def test_a_taken_port_is_never_handed_out(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, taken + 100])
        monkeypatch.setattr(processes, "outgoing_port_range", lambda: (65_000, 65_535))
        monkeypatch.setattr(processes.random, "randrange", lambda *_: next(draws))
        assert free_ports_at(0) == taken + 100


def test_a_server_that_exits_before_listening_fails_the_wait_at_once():
    """(The wait's end would be a TimeoutError: this is the exit seen while waiting.)"""
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=r"exited \(3\) before listening"):
        wait_for_port(free_ports_at(0), timeout_s=30, process=process)
