"""How often agents heartbeat, adapted to the fleet's size, and the silence after which a node counts as lost.

A fleet of N nodes heartbeating every I seconds sends N / I heartbeats a second, and every one of them costs the
monitor, NATS and (when they share a machine) everything else some CPU. Above `budget_per_s` heartbeats a second
the interval grows with the fleet (10,000 nodes at 2,500 a second: every 4 s), and the timeout with it, in the
ratio the operator configured (10 s for 2 s: five missed heartbeats). The monitor announces the interval
(`NodeCadence`, core NATS); agents slow down when they hear it, never below their own configured interval.

Changing the interval never fences a healthy node: a longer timeout applies the moment the interval grows (before
any agent slows down); a shorter one only once every agent has had time to hear the faster interval and send at
it (the previous timeout stays in force meanwhile). The interval shrinks only when the fleet has shrunk by a fifth
below what the current interval was chosen for, so a fleet near a step does not flap between two intervals.
Pure: no I/O, the clock is passed in.
"""

import math
from dataclasses import dataclass, field

STEP_S = 0.5  # intervals are multiples of this: a fleet growing by one node does not announce a new interval
SHRINK_BELOW = 0.8  # the interval shrinks when the fleet is below this share of the size that chose it
MAX_INTERVAL_S = 60.0
ANNOUNCE_EVERY_S = 30.0  # unchanged, the interval is still announced this often (for agents that just started)


@dataclass
class Cadence:
    base_interval_s: float  # what agents are configured with (their floor)
    base_timeout_s: float
    budget_per_s: float  # heartbeats a second the control plane takes before the interval grows; 0: never adapt
    interval_s: float = field(init=False)
    _chosen_for: int = field(default=0, init=False)  # the fleet size the current interval was chosen for
    _previous: tuple[float, float] | None = field(default=None, init=False)  # (timeout, in force until)
    _announced_at: float = field(default=-math.inf, init=False)

    def __post_init__(self) -> None:
        if self.base_interval_s <= 0 or self.base_timeout_s <= 0 or self.budget_per_s < 0:
            raise ValueError("heartbeat interval and node timeout must be > 0, the heartbeat budget >= 0")
        self.interval_s = self.base_interval_s

    def interval_for(self, nodes: int) -> float:
        """The interval a fleet of `nodes` heartbeats at: the configured one until the budget is exceeded."""
        if not self.budget_per_s or nodes <= 0:
            return self.base_interval_s
        wanted = math.ceil(nodes / self.budget_per_s / STEP_S) * STEP_S
        return min(MAX_INTERVAL_S, max(self.base_interval_s, wanted))

    def timeout_for(self, interval_s: float) -> float:
        return self.base_timeout_s * interval_s / self.base_interval_s

    def update(self, nodes: int, now: float) -> bool:
        """The fleet has `nodes` nodes now; True when the interval changed (announce it at once)."""
        wanted = self.interval_for(nodes)
        if wanted == self.interval_s:
            self._chosen_for = max(self._chosen_for, nodes)
            return False
        if wanted < self.interval_s and nodes >= SHRINK_BELOW * self._chosen_for:
            return False
        if wanted < self.interval_s:
            # Agents still at the old, slower pace until they hear the new one: the old timeout holds until each
            # has heard it (at most one announcement's delivery) and sent a heartbeat at the old pace.
            old_timeout = self.timeout(now)
            self._previous = (old_timeout, now + old_timeout + self.interval_s)
        self.interval_s, self._chosen_for = wanted, nodes
        return True

    def timeout(self, now: float) -> float:
        """The silence after which a ready node is lost, now."""
        current = self.timeout_for(self.interval_s)
        if self._previous is not None:
            if now < self._previous[1]:
                return max(current, self._previous[0])
            self._previous = None
        return current

    def due(self, now: float, *, changed: bool) -> bool:
        """Whether to announce now: on a change, else every ANNOUNCE_EVERY_S."""
        if changed or now - self._announced_at >= ANNOUNCE_EVERY_S:
            self._announced_at = now
            return True
        return False
