"""What the benchmarks report of the machine and of each process's CPU."""

import os
import subprocess
import sys

from bench.scale.probe import CpuWindow, cpu_seconds, cpu_spent, machine


def test_the_machine_says_its_cores_and_those_usable():
    said = machine()
    assert said["cores"] == os.cpu_count()
    assert 1 <= said["cores_usable"] <= said["cores"]


def test_cpu_spent_is_per_process_and_in_all():
    spent = cpu_spent({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 4.25, "c": 0.5})
    assert spent == {"a": 0.5, "b": 2.25, "c": 0.5, "all": 3.25}


def test_cpu_seconds_of_a_process_grow_as_it_works_and_a_gone_one_is_zero():
    before = cpu_seconds({"me": os.getpid()})
    sum(i * i for i in range(3_000_000))
    after = cpu_seconds({"me": os.getpid(), "gone": 2**22 + 1})
    assert after["me"] > before["me"] and after["gone"] == 0.0


def test_cpu_seconds_count_what_a_process_forked_alive_or_reaped():
    """A task's shim and command are the agent's CPU: a child's work counts while it runs and once it was reaped."""
    burn = "sum(i * i for i in range(4_000_000))"
    before = cpu_seconds({"me": os.getpid()})["me"]
    subprocess.run([sys.executable, "-c", burn], check=True)
    reaped = cpu_seconds({"me": os.getpid()})["me"]
    assert reaped - before >= 0.05  # in its parent's children's times once reaped
    child = subprocess.Popen(
        [sys.executable, "-c", f"{burn}; print(flush=True); import time; time.sleep(30)"], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()  # its work is done
        alone = cpu_seconds({"child": child.pid})["child"]
        with_child = cpu_seconds({"me": os.getpid()})["me"]  # alive, in its parent's (in clock ticks: exact sums)
        assert alone >= 0.05 and round(with_child - reaped, 2) >= alone
        both = cpu_seconds({"me": os.getpid(), "child": child.pid})  # a process named on its own counts apart
        assert both["child"] == alone and both["me"] - reaped < alone
    finally:
        child.kill()
        child.wait()


def test_a_window_counts_a_named_child_once():
    """bench.scale names the stack's processes and the bench itself, their parent: a named child's work is its own
    row's, not its parent's too."""
    child = subprocess.Popen(
        [sys.executable, "-c", "sum(i * i for i in range(6_000_000)); print(flush=True); import time; time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    try:
        window = CpuWindow({"me": os.getpid(), "child": child.pid})
        assert child.stdout is not None
        child.stdout.readline()  # its work is done; this process waited meanwhile
        shares = window.percent()
        assert shares["child"] > 10 and shares["me"] < shares["child"] / 2
    finally:
        child.kill()
        child.wait()
