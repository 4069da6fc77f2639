"""The contention charge's wait plan, built only as far as a charge asks, against the whole plan GPU by GPU."""

import random

import pytest

from services.placement.policy.contention import Kind

INF = float("inf")


def _whole_plan(*, now, idle, ends, backlog, total):
    """Every backlog job, in queue order, on the first GPUs back (one entry per GPU): its wait, or never."""
    back = sorted([now] * idle + [t for t, n in ends for _ in range(n)])
    waits = []
    for _, gpus, value, duration in sorted(backlog):
        if gpus > total:
            waits.append((INF, value))
            continue
        start = back[gpus - 1]
        back = sorted(back[gpus:] + [start + duration] * gpus)
        waits.append((max(0.0, start - now), value))
    return waits


@pytest.mark.parametrize("seed", range(60))
def test_the_plan_charges_what_the_whole_plan_does(seed):
    rng = random.Random(seed)
    now, kind = 1000.0, Kind()
    kind.free = rng.randrange(0, 12)
    ends = [(now + rng.choice((0.0, rng.uniform(1, 5000))), rng.randrange(1, 4)) for _ in range(rng.randrange(0, 6))]
    for t, n in ends:
        kind.hold(t, n)
    kind.gpus = kind.free + kind.busy
    backlog = [
        (
            (rng.random() < 0.5, rng.uniform(0, 100), f"j{i}"),
            rng.choice((1, 1, 1, 2, 4, 16)),
            rng.uniform(0, 1),
            rng.uniform(1, 3000),
        )
        for i in range(rng.randrange(0, 25))
    ]
    for entry in backlog:
        kind.enqueue(entry[0][2], entry)
    taken = rng.randrange(0, 4)
    idle = max(kind.free - taken, 0)
    waits = _whole_plan(now=now, idle=idle, ends=ends, backlog=backlog, total=idle + kind.busy)
    plan = kind.waits(now, taken)

    for cut in [rng.uniform(0, 8000) for _ in range(5)]:  # one plan asked for several cuts, longer or shorter
        expected = sum(value * min(wait, cut) for wait, value in waits)
        assert plan.relief(cut) == pytest.approx(expected, rel=1e-9, abs=1e-9)
