"""How fast a task may print (pure): token buckets of lines and bytes; past them lines are dropped and counted."""

from dataclasses import dataclass, field


@dataclass
class Bucket:
    """`rate` tokens a second, at most `capacity` saved up; full at first."""

    rate: float
    capacity: float
    tokens: float = field(init=False)
    at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def refill(self, now: float) -> None:
        if self.at is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now


@dataclass
class OutputRate:
    """A task's output allowance: `lines_per_s` and `bytes_per_s`, with `burst_s` seconds of either saved up."""

    lines_per_s: float
    bytes_per_s: float
    burst_s: float
    dropped: int = 0  # lines refused since the last notice
    resting: bool = False  # ran out: output is dropped unsplit until a second of allowance is saved up
    lines: Bucket = field(init=False)
    size: Bucket = field(init=False)

    def __post_init__(self) -> None:
        self.lines = Bucket(self.lines_per_s, max(1.0, self.lines_per_s * self.burst_s))
        self.size = Bucket(self.bytes_per_s, max(1.0, self.bytes_per_s * self.burst_s))

    def admit(self, nbytes: int, *, now: float) -> bool:
        """Whether a line of `nbytes` may go out now (it then uses its tokens); a refused one is counted."""
        self.lines.refill(now)
        self.size.refill(now)
        cost = min(nbytes + 1, self.size.capacity)  # a line longer than the whole allowance waits for all of it
        if self.lines.tokens < 1 or self.size.tokens < cost:
            self.dropped += 1
            return False
        self.lines.tokens -= 1
        self.size.tokens -= cost
        return True

    def spent(self, *, now: float) -> bool:
        """Whether what comes now is dropped whole, unsplit (`drop`): once the allowance ran out, until a second of
        it is saved up again (a line's worth at a time would have each read split again for one line)."""
        self.lines.refill(now)
        self.size.refill(now)
        if self.lines.tokens < 1 or self.size.tokens < 1:
            self.resting = True
        elif self.lines.tokens >= min(self.lines_per_s, self.lines.capacity) and self.size.tokens >= min(
            self.bytes_per_s, self.size.capacity
        ):
            self.resting = False
        return self.resting

    def drop(self, lines: int) -> None:
        """Count `lines` refused together."""
        self.dropped += lines

    def take_dropped(self) -> int:
        """Lines refused since last asked."""
        dropped, self.dropped = self.dropped, 0
        return dropped


def dropped_notice(count: int, rate: OutputRate) -> str:
    return (
        f"[trainmaster] {count} lines dropped: the task printed faster than {rate.lines_per_s:g} lines/s or "
        f"{rate.bytes_per_s:g} bytes/s (with {rate.burst_s:g} s of either saved up)"
    )
