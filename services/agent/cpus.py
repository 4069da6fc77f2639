"""Which of the host's CPUs each running task is given, and how many CPUs' worth of time it may use.

Placement counts a job's CPUs (`shared.jobs.task_cpus`) against its node's; here the task is held to them. A task
with GPUs gets at least its GPUs' share of the node's CPUs (`task_cpus`: 1 GPU of an 8-GPU, 128-CPU node, 16), as
it gets their share of host memory: the default of one CPU would starve its DataLoader workers and NCCL threads.

The shim sets the task's CPU affinity to the CPUs chosen here before the command starts, so what sizes its threads
by the CPUs it may run on (OpenMP and so PyTorch's intra-op threads, MKL, `torch.compile`'s compile workers,
`os.sched_getaffinity`) sizes them to the task's share, not to the whole host: on a 64-core node a 2-CPU job no
longer starts 64 threads that fight its neighbours'. Affinity is a placement a task could widen itself; where the
task has a cgroup with the cpu controller (`services/agent/cgroups.py`: cpu.max, or v1's CFS quota), its CPU time is
capped too, which it cannot pass. Without one (agent not root, cgroups off, a host that hands down no cpu
controller) affinity alone holds it.

The CPUs are shared out least-loaded first: a task gets the `ceil(cpus)` CPUs that the fewest running tasks are
pinned to, ties broken in an order that starts at a different CPU on each node. A task asking for more CPUs than the
agent may use gets them all. Agents that share one host cannot share its CPUs out between them: there pinning is off
(`task_pin_cpus`; `make run`'s stack turns it off), the kernel places tasks, and a task is told its CPUs in
`OMP_NUM_THREADS` (`services/agent/taskenv.py`).
"""

import hashlib
import math
import os
from collections import Counter
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
    """The CPUs each running task (by its key) is pinned to."""

    def __init__(self, cpus: Iterable[int], *, node_id: str = "") -> None:
        self.order = preferred_order(cpus, node_id)
        if not self.order:
            raise ValueError("a host has at least one CPU")
        self.held: dict[str, tuple[int, ...]] = {}

    def load(self) -> Counter[int]:
        """How many running tasks each CPU holds."""
        load = Counter(dict.fromkeys(self.order, 0))
        load.update(cpu for cpus in self.held.values() for cpu in cpus)
        return load

    def take(self, key: str, cpus: float) -> tuple[int, ...]:
        """The CPUs for task `key` asking for `cpus` CPUs. A task's key is taken once (the agent's journal runs a
        start once): a second take while it holds CPUs is a bug, refused rather than counted twice."""
        if key in self.held:
            raise ValueError(f"task {key} holds CPUs already")
        wanted = min(len(self.order), max(1, math.ceil(cpus)))
        load = self.load()
        rank = {cpu: i for i, cpu in enumerate(self.order)}
        chosen = tuple(sorted(sorted(self.order, key=lambda cpu: (load[cpu], rank[cpu]))[:wanted]))
        self.held[key] = chosen
        return chosen

    def give_back(self, key: str) -> None:
        """Task `key` ended (or never started): its CPUs hold one task less. Nothing for a key that holds none."""
        self.held.pop(key, None)
