"""Make room: move a long job that could rent off an owned GPU when jobs that may only run there queue behind it.

A job that could rent may take a free owned GPU at a moment nobody queued for it (the wait it causes is then charged
at nothing, `contention.py`) and hold it for months; the jobs that may only run on owned capacity and arrive later
wait behind it. The reverse of pull-back: once such jobs wait, a running job that may rent, checkpoints and still has
long to run is moved to a rental (checkpointed, resumed on a node rented for it) when the wait it takes off them, at
their own exchange rates, is worth more than the rental's dollars and the time the move costs it. Single-node jobs
only (pure; the weighing of `contention.Backlog.charge`, by the same rule: `delay_dollars`).
"""

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.placement.policy.capacity import expected_end
from services.placement.policy.contention import (
    INF,
    Waits,
    delay_dollars,
    delay_share,
    head_dollars,
)
from services.placement.policy.decisions import MakeRoom, Start, Wait
from services.placement.policy.hosting import could_host
from services.placement.policy.market import pick_market
from services.placement.policy.models import OWNED_KINDS, JobRequest, Node, RunningJob
from services.placement.policy.options import (
    backlog_value_per_s,
    job_kinds,
    paid_dollars,
    provision_options,
    risk_factor,
    time_value_per_s,
)
from services.placement.policy.order import backlog_order
from services.placement.policy.passes import Pass


@dataclass(slots=True)
class Shape:
    """Owned-only jobs of one shape left waiting this pass: what their time is worth and how long each still waits
    (its Wait's `until`; unknown: as long as anything)."""

    job: JobRequest  # one of them: what a node must offer to run any of them
    kinds: tuple[str, ...]
    # the owned GPUs of its kinds and models: the one queue they wait in (`contention.queue_keys`); None: the freed
    # GPU's kind (`PolicyConfig.one_owned_queue` off)
    gpus: int | None = None
    pending: Waits = field(default_factory=Waits)

    def relief(self, freed: "Freed") -> float:
        """Dollars of waiting taken off these jobs when g of the N GPUs they may use are freed for d seconds: each
        wait t shortened by g * min(d, t) / N (`delay_dollars`, the contention charge's rule)."""
        return delay_dollars(self.pending, gpus=freed.gpus, kind_gpus=self.of(freed), held_s=freed.held_s)

    def share(self, freed: "Freed") -> float:
        return delay_share(gpus=freed.gpus, kind_gpus=self.of(freed))

    def of(self, freed: "Freed") -> int:
        """N: the GPUs these jobs wait for, of which `freed` are freed."""
        return freed.kind_gpus if self.gpus is None else self.gpus

    def fits(self, gpus: int) -> int:
        """How many of these jobs `gpus` freed GPUs start at once."""
        return gpus // max(self.job.gpu_count, 1)


@dataclass(frozen=True, slots=True)
class Freed:
    """g owned GPUs freed for the d seconds the job moved off them had left, on a kind of `kind_gpus` GPUs."""

    gpus: int
    held_s: float
    kind_gpus: int


def waiting_shapes(p: Pass) -> list[Shape]:
    """The owned-only single-node jobs this pass left waiting, grouped by what they need of a node."""
    started = {d.job_id for d in p.decisions if isinstance(d, Start)}
    until = {d.job_id: d.until for d in p.decisions if isinstance(d, Wait)}
    shapes: dict[tuple, Shape] = {}
    for job in p.state.queue:
        kinds = job_kinds(job, p.kinds)
        if p.rents(job) or not job.gpu_count or job.node_count != 1 or job.id in started:
            continue
        key = (
            kinds,
            job.gpu_count,
            job.min_gpu_memory_gb,
            job.gpu_models,
            job.cpu,
            job.cpus_at_gpu_share,
            job.memory_gb,
        )
        shape = shapes.get(key)
        if shape is None:
            gpus = queue_gpus(p.state.nodes, kinds, job.gpu_models) if p.config.one_owned_queue else None
            shape = shapes[key] = Shape(job, kinds, gpus)
        at = until.get(job.id)
        wait = INF if at is None else max(0.0, at - p.now)
        order = backlog_order(job, p.config, usage=p.state.usage_by_user)
        shape.pending.waits.append((wait, backlog_value_per_s(job, p.config), order))
    for shape in shapes.values():
        shape.pending.index()
    return list(shapes.values())


def queue_gpus(nodes: Iterable[Node], kinds: tuple[str, ...], models: frozenset[str]) -> int:
    """The owned GPUs of these kinds and models (none: any): the queue a shape waits in, as the contention charge
    plans it (`contention.queue_keys`)."""
    owned = [kind for kind in kinds if kind in OWNED_KINDS]
    return sum(n.gpu_count for n in nodes if n.kind in owned and (not models or n.gpu_model in models))


def served(shape: Shape, node: Node, gpus: int) -> bool:
    """Whether jobs of this shape could run on `gpus` GPUs of `node` once freed."""
    return node.kind in shape.kinds and shape.job.gpu_count <= gpus and could_host(node, shape.job)


def remaining_job(run: RunningJob, node: Node, remaining_s: float, reference_tflops: float) -> JobRequest:
    """The running job as what is left of it, at the reference throughput (what a rental would run)."""
    left = remaining_s * node.tflops / reference_tflops
    predicted = None if run.job.predicted_duration_s is None else left
    return dataclasses.replace(run.job, expected_duration_s=left, predicted_duration_s=predicted)


def make_room(p: Pass) -> None:
    """Moves, largest saving first, at most `make_room_max_per_pass`; each takes its wait off the jobs it serves, so
    the next is weighed on what is left."""
    config, now = p.config, p.now
    if "on_demand" not in p.kinds or config.make_room_max_per_pass <= 0:
        return
    nodes = {n.id: n for n in p.state.nodes}
    candidates = []
    for run in p.state.running:
        node = nodes.get(run.node_ids[0]) if len(run.node_ids) == 1 else None
        if (
            node is None
            or run.moving
            or node.kind not in OWNED_KINDS
            or run.job.checkpoint_interval_s is None
            or "on_demand" not in job_kinds(run.job, p.kinds)
        ):
            continue
        remaining = expected_end(run, now) - now
        if remaining >= config.make_room_min_remaining_s:
            candidates.append((run, node, remaining))
    if not candidates:
        return
    shapes = waiting_shapes(p)
    if not shapes:
        return
    kind_gpus: dict[str, int] = {}
    for n in p.state.nodes:
        kind_gpus[n.kind] = kind_gpus.get(n.kind, 0) + n.gpu_count
    scored = sorted(
        (
            (_gain(p, run, node, remaining, shapes, kind_gpus[node.kind])[0], run, node, remaining)
            for run, node, remaining in candidates
        ),
        key=lambda c: (-c[0], c[1].job.id),
    )
    moved = 0
    for first, run, node, remaining in scored:
        if first <= 0 or moved >= config.make_room_max_per_pass:
            break
        gain, rental = _gain(p, run, node, remaining, shapes, kind_gpus[node.kind])
        if gain <= 0 or rental is None:
            continue
        mine = [shape for shape in shapes if served(shape, node, run.job.gpu_count)]
        freed = Freed(run.job.gpu_count, remaining, kind_gpus[node.kind])
        starts = starters(mine, freed)
        for shape in mine:
            shape.pending.shorten(shape.share(freed), freed.held_s, started={i for s, i in starts if s is shape})
        p.decisions.append(MakeRoom(run.job.id, run.node_ids, rental, run.job.node_count))
        moved += 1


def _gain(
    p: Pass, run: RunningJob, node: Node, remaining: float, shapes: list[Shape], kind_gpus: int
) -> tuple[float, str | None]:
    """What moving the job to its best rental saves in all (the waiting taken off others - the rental's dollars at
    the upper quantile and its idle grace - the time the move costs the job at its rate), and that rental's instance
    type. Freeing g GPUs of a kind of N for the d seconds the job has left shortens each served wait t by
    g * min(d, t) / N (the contention charge's rule, `delay_dollars`), and the next jobs in line that fit on the g
    GPUs (in the engine's queue order, `starters`) start on them now, their whole wait off. N is the GPUs a served
    shape may use, over all its owned kinds and models: the one queue it waits in."""
    config, now = p.config, p.now
    gpus = run.job.gpu_count
    mine = [shape for shape in shapes if served(shape, node, gpus)]
    freed = Freed(gpus, remaining, kind_gpus)
    saved = sum(shape.relief(freed) for shape in mine) + head_relief(starters(mine, freed), freed)
    if saved <= 0:
        return 0.0, None
    job = remaining_job(run, node, remaining, config.reference_tflops)
    rentals = provision_options(job, p.state.catalogue, now=now, config=config)
    if not rentals:
        return 0.0, None
    best = pick_market(rentals, job, now=now, config=config)
    if best.instance is None:
        return 0.0, None
    # the time the move costs the job; a faster rental's gain is not counted: making room is paid for by the jobs
    # it serves, not by the moved job's own speed-up (`pick` already chose the owned GPU for it, near-ties included)
    later = max(0.0, best.finish + config.migration_s - (now + remaining))
    cost = paid_dollars(best, risk_factor(run.job, config)) + time_value_per_s(run.job, config) * later
    return saved - cost - config.migration_fixed_cost, best.instance.name


def starters(shapes: list[Shape], freed: Freed) -> list[tuple[Shape, int]]:
    """The waiting jobs the freed GPUs start now, as (shape, index in its `pending`): the next in line of every shape
    served, in the engine's queue order, each on the freed GPUs still left if it fits on them."""
    line = sorted(
        (shape.pending.waits[i][2], n, i)
        for n, shape in enumerate(shapes)
        for i in shape.pending.head(shape.fits(freed.gpus))
    )
    left, out = freed.gpus, []
    for _, n, i in line:
        gpus = max(shapes[n].job.gpu_count, 1)
        if gpus <= left:
            left -= gpus
            out.append((shapes[n], i))
    return out


def head_relief(starts: list[tuple[Shape, int]], freed: Freed) -> float:
    """What the jobs the freed GPUs start gain beyond their share (`Shape.relief`): their whole wait up to d comes
    off, not g / N of it (the pricing is capped at d; the wait itself is gone, `Waits.shorten`): `head_dollars`, the
    contention charge's rule for the jobs a taken GPU would have started."""
    return sum(
        head_dollars([shape.pending.waits[i][:2]], share=shape.share(freed), held_s=freed.held_s) for shape, i in starts
    )
