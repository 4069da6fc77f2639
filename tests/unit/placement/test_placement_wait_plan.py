"""The contention charge's wait plan, built only as far as a charge asks, against the whole plan GPU by GPU."""

import random

import pytest

from services.placement.policy.contention import Kind, Waits, delay_dollars, delay_share

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


@pytest.mark.parametrize("ahead", [True, False])
def test_a_backlog_entry_of_no_gpu_waits_for_none_wherever_it_is_in_the_queue(ahead):
    # one GPU busy for an hour, a one-GPU job waiting for it; an entry asking no GPU, ahead of it or behind it
    def plan(*entries):
        kind = Kind(gpus=1)
        kind.hold(1000.0 + 3600.0, 1)
        for entry in entries:
            kind.enqueue(entry[0][2], entry)
        return kind.waits(1000.0, 0)

    waiting = ((False, 1.0, "j1"), 1, 0.5, 600.0)
    no_gpu = ((False, 0.0 if ahead else 2.0, "j0"), 0, 0.25, 600.0)

    assert plan(waiting, no_gpu).relief(7200.0) == pytest.approx(plan(waiting).relief(7200.0)) == 0.5 * 3600.0


def test_the_wait_taken_off_by_shortening_is_what_delay_dollars_prices():
    rng = random.Random(5)
    for _ in range(40):
        waits = Waits([(rng.choice((INF, rng.uniform(0, 9000))), rng.uniform(0, 1)) for _ in range(rng.randrange(8))])
        waits.index()
        before = list(waits.waits)
        gpus = rng.randrange(1, 5)
        kind_gpus, held = gpus + rng.randrange(0, 8), rng.uniform(0, 12000)  # a kind has the GPUs freed
        priced = delay_dollars(waits, gpus=gpus, kind_gpus=kind_gpus, held_s=held)
        waits.shorten(delay_share(gpus=gpus, kind_gpus=kind_gpus), held)
        taken = sum(v * (w - after) for (w, v), (after, _) in zip(before, waits.waits, strict=True) if w < INF)
        taken += sum(v * min(held, w) * gpus / max(kind_gpus, 1) for w, v in before if w == INF)
        assert taken == pytest.approx(priced, rel=1e-9, abs=1e-9)


def test_a_start_on_a_kind_drops_the_plans_made_before_it():
    kind = Kind(gpus=2, free=2)
    kind.enqueue("j1", ((False, 1.0, "j1"), 1, 1.0, 600.0))
    assert kind.waits(0.0, 1).relief(3600.0) == 0.0  # one GPU left for it: it starts now

    kind.start(7200.0, 1)  # one GPU taken for two hours

    assert kind.waits(0.0, 1).relief(3600.0) == pytest.approx(3600.0)  # the other taken too: it waits past the cut
