"""Trial parameters drawn from a search space: trial k of a search always gets the same values (idempotent)."""

import math
import random
from typing import Any

from services.submitter.searches.models import Param


def sample(space: dict[str, Param], *, seed: int, trial: int) -> dict[str, Any]:
    """The parameters of trial `trial` (independent random draws keyed by seed and trial)."""
    rng = random.Random(f"{seed}:{trial}")
    return {name: _draw(param, rng) for name, param in sorted(space.items())}


def _draw(param: Param, rng: random.Random) -> Any:
    if param.type == "categorical":
        choices = param.options()
        return choices[rng.randrange(len(choices))]
    low, high = param.bounds()
    if param.type == "int":
        if param.log:  # uniform in log over [low, high + 1), then down to an integer
            value = math.exp(rng.uniform(math.log(low), math.log(high + 1)))
            return min(high, max(low, int(value)))
        return rng.randint(int(low), int(high))
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if param.log else rng.uniform(low, high)
    return min(high, max(low, float(f"{value:.6g}")))  # the value the job's environment shows


def as_text(value: Any) -> str:
    """A parameter value as the job's algorithm.parameters (and so its environment) carries it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)
