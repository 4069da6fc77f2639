"""What the scale benchmark watches: node verdicts, consumer lag, CPU and memory per process, API latency."""

import asyncio
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

from shared import busroles
from shared.bus import JOBS, NODES, RPC_HEALTH, servers

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, *, apart: frozenset[int] = frozenset()) -> float:
    """User plus system CPU seconds of a process and all its descendants, those it reaped included, but those in
    `apart` (counted on their own) and theirs (0 when it is gone). A task's shim, its command and what an agent
    forks are the agent's: left out until 2026-11-28, they were about 40% of the CPU of a burst of no-op jobs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own_and_reaped = sum(int(f) for f in fields[11:15]) / TICKS
    return own_and_reaped + sum(cpu_s(child, apart=apart) for child in _children(pid) if child not in apart)


def _children(pid: int) -> list[int]:
    """The live children of a process (each thread's list: a child is listed under the thread that forked it)."""
    found: list[int] = []
    try:
        for thread in os.scandir(f"/proc/{pid}/task"):
            try:
                found += [int(c) for c in Path(thread.path, "children").read_text().split()]
            except OSError:
                pass
    except OSError:
        pass
    return found


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each named process has used so far."""
    apart = frozenset(pids.values())  # a stack's processes are the bench's children: each counted once, on its own
    return {name: cpu_s(pid, apart=apart) for name, pid in pids.items()}


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process used between two `cpu_seconds` readings, and all of them together."""
    spent = {name: round(after[name] - before.get(name, 0.0), 2) for name in sorted(after)}
    return {**spent, "all": round(sum(spent.values()), 2)}


def machine() -> dict[str, object]:
    """The cores a run had: the machine's and those this process may run on (a container or `taskset` has fewer)."""
    return {
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
    }


def pace_ms(rounds: int = 3) -> float:
    """The machine's pace as this process finds it: CPU milliseconds of a fixed pure-Python loop (the best of
    `rounds`). A shared VM's pace moves by a third from one minute to the next (measured: 203-336 ms of the same
    loop), so a run's figures are read with the pace it had."""
    best = float("inf")
    for _ in range(rounds):
        started, total = time.process_time(), 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.process_time() - started)
    return round(best * 1000, 1)


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass
class CpuWindow:
    """CPU use of each process over a window, as a percentage of one core."""

    pids: dict[str, int]
    at: float = field(default_factory=time.monotonic)
    start: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = cpu_seconds(self.pids)

    def percent(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self.at, 1e-6)
        now = cpu_seconds(self.pids)  # each process named counted once (the bench's children are the stack)
        return {name: round(100 * (now[name] - self.start[name]) / elapsed, 1) for name in self.pids}


@dataclass
class Watch:
    """Node verdicts as the monitor publishes them, and the lag of every durable consumer."""

    nats_url: str
    creds: Path
    ready_at: dict[str, float] = field(default_factory=dict)
    lost: list[tuple[str, float]] = field(default_factory=list)  # (node, when the loss was announced)
    max_lag: dict[str, int] = field(default_factory=dict)
    heartbeat_backlog_max: int = 0
    monitor_details: dict = field(default_factory=dict)

    async def open(self) -> None:
        # the operator's own inbox: services answer only into inboxes of those that may ask them
        self.nc = await nats.connect(
            servers(self.nats_url), user_credentials=str(self.creds), inbox_prefix=busroles.inbox(busroles.OPERATOR)
        )
        self.js = self.nc.jetstream()

        async def on_state(msg) -> None:
            event = json.loads(msg.data)
            if event.get("state") == "ready":
                self.ready_at.setdefault(event["node_id"], time.monotonic())
            elif event.get("state") == "lost":
                self.lost.append((event["node_id"], time.monotonic()))

        await self.nc.subscribe("tm.node.evt.state", cb=on_state)
        await self.nc.flush()

    async def sample_lag(self) -> None:
        for stream in (JOBS.name, NODES.name):
            for info in await self.js.consumers_info(stream):
                lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
                name = info.name
                self.max_lag[name] = max(self.max_lag.get(name, 0), lag)
        try:
            reply = await self.nc.request(RPC_HEALTH.format(service="monitor"), b"{}", timeout=5)
            self.monitor_details = json.loads(reply.data).get("details", {})
            backlog = self.monitor_details.get("heartbeat_backlog", 0)
            self.heartbeat_backlog_max = max(self.heartbeat_backlog_max, int(backlog))
        except (nats.errors.Error, TimeoutError, ValueError):
            pass

    async def lag_forever(self, every_s: float = 2.0) -> None:
        while True:
            try:
                await self.sample_lag()
            except (nats.errors.Error, TimeoutError):
                pass
            await asyncio.sleep(every_s)

    async def close(self) -> None:
        await self.nc.close()
