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

The fence also counts the node's silences: each time no acknowledged heartbeat was sent within the window, the
count goes up (a restarted agent continues its previous run's count, `resume`). The monitor may have called the node
lost during any of them and dropped its queued starts; a start it issued before the last one (`StartTask.silences`,
the count the node had last reported) may have been delivered only after that drop, so it is `stale` and refused.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

FENCED = "fenced"  # the stop reason of a task its own agent stopped (TaskExited: terminated, "stopped: fenced")
CHECK_S = 0.25  # how often the agent looks whether it must fence (a comparison: nothing to spare)
RESERVE_S = 0.5  # the kill of what is left (every process of the task's uid and marker) and its exit noticed
DEFAULT_MARGIN_S, DEFAULT_GRACE_S = 4.0, 1.0  # for the default node timeout (10 s) and heartbeat interval (2 s)
MARGIN_SHARE = 0.4  # of a shorter node timeout: as the default margin is of the default timeout


def window_s(*, timeout_s: float, margin_s: float) -> float:
    """The silence (since the last acknowledged heartbeat was sent) after which the agent fences."""
    return timeout_s - margin_s


def fence_due(*, acked_at: float, now: float, timeout_s: float, margin_s: float) -> bool:
    """Whether no heartbeat sent in the last window has been acknowledged: the node's tasks must stop now."""
    return now - acked_at >= window_s(timeout_s=timeout_s, margin_s=margin_s)


def fitted_margin(*, timeout_s: float, interval_s: float) -> float:
    """The margin when none is set: the default where it leaves two heartbeats in the window, else the same share
    of the node timeout, no more than leaves two heartbeats (a node timeout too short for any is `margin_problem`'s
    to tell)."""
    if timeout_s - DEFAULT_MARGIN_S >= 2 * interval_s:
        return DEFAULT_MARGIN_S
    return min(MARGIN_SHARE * timeout_s, timeout_s - 2 * interval_s)


def fitted_grace(margin_s: float) -> float:
    """The grace when none is set: the default, or what the margin holds (twice the grace, the check, the reserve)."""
    return max(0.0, min(DEFAULT_GRACE_S, (margin_s - CHECK_S - RESERVE_S) / 2))


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
    silences: int = field(init=False, default=0)  # windows without an acknowledged heartbeat, this node's whole life
    _unheard: bool = field(init=False, default=False)  # in one of them now

    def __post_init__(self) -> None:
        self.acked_at = self.clock()  # a fresh agent runs nothing: its first window counts from its start

    def resume(self, *, silences: int, unheard_for_s: float) -> None:
        """Continue a previous run's count, its last acknowledged heartbeat sent `unheard_for_s` ago (a gap of the
        window or more counts as one more silence at the next look)."""
        self.silences = silences
        self.acked_at = self.clock() - unheard_for_s

    def acked(self, sent_at: float) -> None:
        """The heartbeat sent at `sent_at` (this clock) reached the server; an older answer changes nothing."""
        self.acked_at = max(self.acked_at, sent_at)

    def due(self) -> bool:
        """Whether the node is unheard past the window now (a new silence counted as it begins)."""
        timeout_s = self.timeout_s()
        due = window_s(timeout_s=timeout_s, margin_s=self.margin_s) >= 2 * self.interval_s() and fence_due(
            acked_at=self.acked_at, now=self.clock(), timeout_s=timeout_s, margin_s=self.margin_s
        )
        if due and not self._unheard:
            self.silences += 1
        self._unheard = due
        return due

    def stale(self, silences: int) -> bool:
        """Whether a start issued when the node had reported `silences` may come from before its latest silence:
        any count but the node's own now. A lower one was issued before a silence; a higher one can only be one the
        node reported before it lost its count (its file unreadable or wiped), so it is as old as that."""
        self.due()
        return silences != self.silences

    def silent_s(self) -> float:
        return self.clock() - self.acked_at
