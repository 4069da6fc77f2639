"""A token bucket: how many mints the minter grants in a burst, and how fast it grants them after."""

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """`capacity` tokens, refilled at `per_minute`; each grant takes one (refused when none is left)."""

    capacity: int
    per_minute: float
    tokens: float = -1.0  # full at the first take
    at: float = 0.0

    def take(self, now: float) -> bool:
        """Take a token at `now` (seconds, monotonic), if one is left."""
        if self.tokens < 0:
            self.tokens, self.at = float(self.capacity), now
        elapsed = max(now - self.at, 0.0)
        self.tokens = min(float(self.capacity), self.tokens + elapsed * self.per_minute / 60.0)
        self.at = max(now, self.at)
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
