"""Self-fencing: an agent whose heartbeats the bus has stopped acknowledging stops its own tasks before the monitor
could call its node lost and place their jobs again, so a live but unheard node never runs an attempt beside the
next one (two writers on one checkpoint, two bills).

The monitor declares a node lost once it has heard nothing from it for the node timeout, counted from when it read
the node's last heartbeat, which is after the agent sent it. The agent counts from the moment it sent the last
heartbeat the server acknowledged, so its clock never starts later than the monitor's, and it stops its tasks the
margin before the timeout: the margin must hold the tasks' grace twice (the SIGTERM grace of the group, then as
long again for what is left of the task outside it to end before everything of its uid is killed), the fence's
own check period and a reserve for the kill and its cleanup. The node timeout is the monitor's word (`NodeCadence`,
which grows it with the fleet) and, until one is heard, the agent's own setting, the same `node_timeout_s` the
monitor is configured with (`CommonSettings`; the stack gives every process the same). Pure: the clock is passed
in.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

FENCED = "fenced"  # the stop reason of a task its own agent stopped (TaskExited: terminated, "stopped: fenced")
CHECK_S = 0.25  # how often the agent looks whether it must fence (a comparison: nothing to spare)
RESERVE_S = 0.5  # the kill of what is left (every process of the task's uid and marker) and its exit noticed


def window_s(*, timeout_s: float, margin_s: float) -> float:
    """The silence (since the last acknowledged heartbeat was sent) after which the agent fences."""
    return timeout_s - margin_s


def fence_due(*, acked_at: float, now: float, timeout_s: float, margin_s: float) -> bool:
    """Whether no heartbeat sent in the last window has been acknowledged: the node's tasks must stop now."""
    return now - acked_at >= window_s(timeout_s=timeout_s, margin_s=margin_s)


def margin_problem(*, timeout_s: float, margin_s: float, grace_s: float, interval_s: float) -> str | None:
    """Why these settings cannot fence safely, or None: the margin must hold the fenced tasks' end, and the window
    left must outlast two heartbeats (one lost beat never fences a healthy node)."""
    needed = 2 * grace_s + CHECK_S + RESERVE_S
    if margin_s < needed:
        return (
            f"fence_margin_s ({margin_s:g}) must be at least twice fence_grace_s ({grace_s:g}) plus "
            f"{CHECK_S + RESERVE_S:g} s ({needed:g}): a fenced task must be dead before the monitor calls its node lost"
        )
    if window_s(timeout_s=timeout_s, margin_s=margin_s) < 2 * interval_s:
        return (
            f"node_timeout_s ({timeout_s:g}) less fence_margin_s ({margin_s:g}) must be at least two heartbeat "
            f"intervals ({2 * interval_s:g} s), or one late heartbeat would stop every task of a healthy node"
        )
    return None


@dataclass
class Fence:
    """When the last acknowledged heartbeat was sent, and whether the node must stop its tasks now."""

    timeout_s: Callable[[], float]  # the monitor's node timeout as this agent last heard it (else its setting)
    margin_s: float
    grace_s: float  # SIGTERM to SIGKILL for a fenced task
    clock: Callable[[], float] = time.monotonic
    # the heartbeat interval in force: a window shorter than two of them (a monitor announcing a node timeout this
    # agent cannot fence within, logged as an error at each announcement) fences nothing, since one late beat would
    # stop every task of a healthy node, and fencing at once would stop them all for ever
    interval_s: Callable[[], float] = lambda: 0.0
    acked_at: float = field(init=False)  # when the last heartbeat the server acknowledged was sent

    def __post_init__(self) -> None:
        self.acked_at = self.clock()  # a fresh agent runs nothing: its first window counts from its start

    def acked(self, sent_at: float) -> None:
        """The heartbeat sent at `sent_at` (this clock) reached the server; an older answer changes nothing."""
        self.acked_at = max(self.acked_at, sent_at)

    def due(self) -> bool:
        timeout_s = self.timeout_s()
        if window_s(timeout_s=timeout_s, margin_s=self.margin_s) < 2 * self.interval_s():
            return False
        return fence_due(acked_at=self.acked_at, now=self.clock(), timeout_s=timeout_s, margin_s=self.margin_s)

    def silent_s(self) -> float:
        return self.clock() - self.acked_at
