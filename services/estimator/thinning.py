"""A long curve thinned to a few points: the whole run kept, each slice by its lowest and highest value."""

from collections.abc import Callable, Sequence
from typing import TypeVar

P = TypeVar("P")


def thin(points: Sequence[P], max_points: int, *, value: Callable[[P], float]) -> list[P]:
    """At most `max_points` of `points`, in order: the first and the last, and from each of the equal slices in
    between its lowest and highest value (so a spike or a dip survives, and the curve is never cut)."""
    if len(points) <= max_points:
        return list(points)
    if max_points < 4:
        return [points[0], points[-1]][:max_points]
    inner = points[1:-1]
    slices = (max_points - 2) // 2
    kept: list[P] = [points[0]]
    for k in range(slices):
        part = inner[k * len(inner) // slices : (k + 1) * len(inner) // slices]
        if not part:
            continue
        low = min(range(len(part)), key=lambda i: value(part[i]))
        high = max(range(len(part)), key=lambda i: value(part[i]))
        kept.extend(part[i] for i in sorted({low, high}))
    kept.append(points[-1])
    return kept
