"""What the benchmarks report of the machine and of each process's CPU."""

import os

from bench.scale.probe import cpu_seconds, cpu_spent, machine


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
