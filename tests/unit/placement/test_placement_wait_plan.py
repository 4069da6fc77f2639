"""The contention charge's wait plan, built only as far as a charge asks, against the whole plan GPU by GPU."""

import random

import pytest

from services.placement.policy.capacity import NodeView
from services.placement.policy.choice import Option
from services.placement.policy.contention import Kind, Waits, backlog, delay_dollars, delay_share
from tests.unit.placement.placement_factories import config, make_job, make_node, make_state

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

    # the jobs that fit on the idle GPUs in queue order start at once; the plan's `first` are the jobs after them
    gpus = [e[1] for e in sorted(backlog)]
    at_once = next((i for i in range(len(gpus)) if sum(gpus[: i + 1]) > idle), len(gpus))
    for cut in [rng.uniform(0, 8000) for _ in range(5)]:  # one plan asked for several cuts, longer or shorter
        expected = sum(value * min(wait, cut) for wait, value in waits)
        assert plan.relief(cut) == pytest.approx(expected, rel=1e-9, abs=1e-9)
        heads = plan.first(3, cut)
        expected_heads = [(min(w, cut), v) for w, v in waits[at_once : at_once + 3]]
        assert [x for w, v in heads for x in (min(w, cut), v)] == pytest.approx(
            [x for pair in expected_heads for x in pair]
        )


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


def _waits(rng: random.Random) -> Waits:
    """Up to 8 jobs: finite or unknown waits, their $ per s, a queue order."""
    waits = Waits(
        [
            (rng.choice((INF, rng.uniform(0, 9000))), rng.uniform(0, 1), (rng.random(), i))
            for i in range(rng.randrange(8))
        ]
    )
    waits.index()
    return waits


def test_the_wait_taken_off_by_shortening_is_what_delay_dollars_prices():
    rng = random.Random(5)
    for _ in range(40):
        waits = _waits(rng)
        gpus = rng.randrange(1, 5)
        kind_gpus, held = gpus + rng.randrange(0, 8), rng.uniform(0, 12000)  # a kind has the GPUs freed
        share = delay_share(gpus=gpus, kind_gpus=kind_gpus)
        finite = Waits([entry for entry in waits.waits if entry[0] < INF])
        finite.index()
        priced = delay_dollars(finite, gpus=gpus, kind_gpus=kind_gpus, held_s=held)
        before = list(waits.waits)

        waits.shorten(share, held)

        taken = sum(v * (w - after) for (w, v, _), (after, _, _) in zip(before, waits.waits, strict=True) if w < INF)
        assert taken == pytest.approx(priced, rel=1e-9, abs=1e-9)
        assert [e for e in waits.waits if e[0] == INF] == [e for e in before if e[0] == INF]  # unknown stays unknown


def test_the_jobs_started_wait_no_more_and_the_rest_lose_their_share():
    rng = random.Random(7)
    for _ in range(40):
        waits = _waits(rng)
        share, held = rng.uniform(0, 1), rng.uniform(0, 12000)
        started = set(waits.head(rng.randrange(0, 3)))
        before = list(waits.waits)

        waits.shorten(share, held, started=started)

        expected = sorted(
            (0.0 if i in started else max(0.0, w - share * min(held, w)), v, order)
            for i, (w, v, order) in enumerate(before)
        )
        assert waits.waits == expected
        assert not set(waits.head(len(before))) & {j for j, e in enumerate(waits.waits) if e[0] == 0.0}


def test_the_next_in_line_is_taken_in_queue_order_among_the_jobs_still_waiting():
    waits = Waits([(50.0, 1.0, (True, 2.0, "c")), (10.0, 1.0, (False, 9.0, "b")), (0.0, 1.0, (False, 0.0, "a"))])
    waits.index()

    # "a" is first in line but waits for nothing; the time-sensitive "b" comes before "c" whatever their waits
    assert [waits.waits[i][2][2] for i in waits.head(2)] == ["b", "c"]

    waits.shorten(0.0, 100.0, started=set(waits.head(1)))
    assert [waits.waits[i][2][2] for i in waits.head(2)] == ["c"]  # "b" started: never the next in line again


def test_a_charge_after_a_start_on_a_kind_counts_the_gpus_the_start_took():
    # two local GPUs, free; two local-only one-GPU jobs of 10 min queued. A job that could rent asks about one GPU for
    # an hour: one queued job starts now, the other, which would have started now on that GPU, waits 10 min (all of
    # it charged: the head of the line). Once another such job has started on a GPU for 2 h, the same ask leaves the
    # queued jobs no GPU until 2 h: each waits past the hour (1/2 of the hour each), the first in line the whole hour
    node = make_node(kind="local", gpu_count=2)
    queued = [make_job(allowed="local", expected_duration_s=600.0) for _ in range(2)]
    first, second = make_job(allowed="any"), make_job(allowed="any")
    state = make_state(nodes=(node,), queue=(*queued, first, second))
    out = backlog(
        state,
        now=0.0,
        config=config(),
        owned_only={job.id: ("local",) for job in queued},
        value_per_s={job.id: 1.0 / 3600 for job in state.queue},
    )
    view = NodeView(node, {}, 0.0, None)

    def on_one_gpu(hours: float) -> Option:
        return Option("start", 0.0, hours * 3600, 0.0, False, 0, hours * 3600, picks=[(view, (0,))])

    assert out.charge(second, on_one_gpu(1)) == pytest.approx(600 / 3600)

    out.started(first, on_one_gpu(2), owned_only=False)

    assert out.charge(second, on_one_gpu(1)) == pytest.approx(0.5 * 2 * 3600 / 3600 + 0.5 * 3600 / 3600)
