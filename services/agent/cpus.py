"""Which of the host's CPUs each running task is given (`spec.resource.cpu_count`).

Placement counts a job's CPUs against its node's; here the task is held to them. The shim sets the task's CPU
affinity to the CPUs chosen here before the command starts, so what sizes its threads by the CPUs it may run on
(OpenMP and so PyTorch's intra-op threads, MKL, `torch.compile`'s compile workers, `os.sched_getaffinity`) sizes
them to its own share, not to the whole host: on a 64-core node a 2-CPU job no longer starts 64 threads that
fight its neighbours'. Affinity is a placement a task could widen itself; where task cgroups exist, the task's CPU
time is also capped at `cpu_count` CPUs (`services/agent/cgroups.py`: cpu.max, or v1's CFS quota), which it cannot.

The CPUs are shared out least-loaded first: a task gets the `ceil(cpu_count)` CPUs that the fewest running tasks
are pinned to, ties broken in an order that starts at a different CPU on each node, so two agents on one host (a
test stack's) do not pile their first tasks onto CPU 0. A task asking for more CPUs than the host has gets them all.
"""

import hashlib
import math
import os
from collections.abc import Iterable


def host_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or a cpuset's, not every CPU of the machine)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this platform: every CPU the OS counts
        return tuple(range(os.cpu_count() or 1))


def preferred_order(cpus: Iterable[int], node_id: str) -> tuple[int, ...]:
    """The host's CPUs rotated to start at one chosen by the node's id: the tie-break among equally loaded CPUs."""
    ordered = sorted(cpus)
    if not ordered:
        return ()
    start = int.from_bytes(hashlib.sha256(node_id.encode()).digest()[:4], "big") % len(ordered)
    return tuple(ordered[start:] + ordered[:start])


class CpuAllotment:
    """The CPUs each running task (by its key) is pinned to, and how many tasks each CPU holds."""

    def __init__(self, cpus: Iterable[int], *, node_id: str = "") -> None:
        self.order = preferred_order(cpus, node_id)
        if not self.order:
            raise ValueError("a host has at least one CPU")
        self.load = dict.fromkeys(self.order, 0)
        self.held: dict[str, tuple[int, ...]] = {}

    def take(self, key: str, cpu_count: float) -> tuple[int, ...]:
        """The CPUs for task `key` asking for `cpu_count` (its CPUs of before, given back first, if it had any)."""
        self.give_back(key)
        wanted = min(len(self.order), max(1, math.ceil(cpu_count)))
        rank = {cpu: i for i, cpu in enumerate(self.order)}
        chosen = tuple(sorted(sorted(self.order, key=lambda cpu: (self.load[cpu], rank[cpu]))[:wanted]))
        for cpu in chosen:
            self.load[cpu] += 1
        self.held[key] = chosen
        return chosen

    def give_back(self, key: str) -> None:
        """Task `key` ended (or never started): its CPUs hold one task less. Nothing for a key that holds none."""
        for cpu in self.held.pop(key, ()):
            self.load[cpu] -= 1
