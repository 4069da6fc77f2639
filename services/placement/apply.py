"""Applying the engine's decisions: a start becomes a published placement, a rental asks billing first, an idle
rented node goes back, a pull-back snapshots the job and keeps the owned node for it, a move to make room rents for
the job first (billing admits it) and then snapshots it (its next attempt is kept to the rented node)."""

import logging
import zlib
from typing import Literal

from shared.clock import utcnow
from shared.events import Assignment, JobMigrateRequested, JobPlaced, Launch
from shared.jobs import Resource, host_memory_gb
from shared.nodes import NodeInfo
from services.placement.fleet import Fleet
from services.placement.inputs import PolicyInputs
from services.placement.policy import Decision, MakeRoom, Provision, PullBack, Release, Start, Wait
from services.placement.queue import JobQueue, QueueItem

log = logging.getLogger(__name__)


async def apply(
    decisions: list[Decision], *, queue: JobQueue, fleet: Fleet, inputs: PolicyInputs
) -> tuple[int, dict[str, str]]:
    """Carry the decisions out in order; returns the jobs started and why each waiting job waits."""
    started, waiting = 0, {}
    for decision in decisions:
        match decision:
            case Start(job_id=job_id, node_ids=node_ids, gpu_indices=gpus, why=why):
                item = queue.items.get(job_id)
                if item is None or item.state != "queued":
                    continue
                assignments = tuple(
                    assignment(r, fleet.info(n), inputs.gpu_ids(n, g))
                    for r, (n, g) in enumerate(zip(node_ids, gpus, strict=True))
                )
                for node_id in node_ids:
                    await fleet.claimed(node_id)
                await place(item, assignments, queue=queue, fleet=fleet, why=why)
                started += 1
            case Provision(instance_type=name, count=count, job_id=job_id):
                item = queue.items[job_id]
                await fleet.provision(
                    name,
                    count,
                    job_id=job_id,
                    project_id=item.project_id,
                    user_name=item.user_name,
                    expected_hours=inputs.hours(item),
                )
            case Release(node_id=node_id):
                await fleet.release(node_id, reason="idle")
            case PullBack(job_id=job_id, from_node_id=source, to_node_id=target):
                await pull_back(job_id, source, target, queue=queue, fleet=fleet)
            case MakeRoom(job_id=job_id, instance_type=name, count=count):
                await make_room(job_id, name, count, queue=queue, fleet=fleet, inputs=inputs)
            case Wait(job_id=job_id, reason=reason):
                waiting[job_id] = reason
    for node in list(fleet.nodes.values()):
        if node.release_when_idle and node.node_id in fleet.idle_since:
            await fleet.release(node.node_id, reason="pulled back")
    return started, waiting


def assignment(rank: int, info: NodeInfo, gpu_indices: tuple[int, ...]) -> Assignment:
    """A rank on a node, with the node's kind, price, size, GPU memory, speed and model as placement's record has
    them (billing charges these, the estimator holds telemetry to that memory, plans with a measured speed and
    records the run on that model, not on what the node's agent says of itself)."""
    gpus = [g for g in info.gpus if g.index in gpu_indices]
    measured = bool(gpus) and all(g.measured_tflops is not None and g.speed > 0 for g in gpus)
    return Assignment(
        rank=rank,
        node_id=info.node_id,
        gpu_indices=gpu_indices,
        node_kind=info.kind,
        price_per_hour=info.price_per_hour,
        node_gpu_count=len(info.gpus),
        gpu_memory_gb=max((g.memory_gb for g in gpus), default=0.0),
        gpu_tflops=min(g.speed for g in gpus) if measured else None,
        gpu_model=min(gpus, key=lambda g: g.speed).model if gpus else "",
    )


# The most host memory a task's spec may carry (`shared.jobs.Resource.memory_gb`): a `JobPlaced` holding more is
# refused by every reader, so the job would stay placed and never start (a node registering 10^6 GB without a record
# figure to cap it; a host out-of-memory requeue doubling past it).
MAX_MEMORY_GB = float(next(m.le for m in Resource.model_fields["memory_gb"].metadata if getattr(m, "le", None)))


async def place(
    item: QueueItem, assignments: tuple[Assignment, ...], *, queue: JobQueue, fleet: Fleet, why: str = ""
) -> None:
    """The job's next attempt on these nodes, published with what its ranks launch."""
    attempt = item.attempt + 1
    master = fleet.info(assignments[0].node_id).address
    port = 29500 + zlib.crc32(f"{item.job_id}:{attempt}".encode()) % 2000
    infos = [fleet.info(a.node_id) for a in assignments]
    memory = min(
        MAX_MEMORY_GB,  # a node's registered memory no record bounds is its own claim: past this, no task spec
        *(
            host_memory_gb(
                item.needs.memory_gb, gpus=item.needs.gpu_count, node_memory_gb=info.memory_gb, node_gpus=len(info.gpus)
            )
            for info in infos
        ),
    )
    resource = item.needs.model_copy(update={"memory_gb": memory})
    launch = Launch(
        master_addr=master,
        master_port=port,
        algorithm=item.algorithm,
        spec=item.spec.model_copy(update={"resource": resource}),
    )
    now = utcnow()
    events = [
        JobPlaced(
            event_id=f"{item.job_id}:placed:{attempt}",
            occurred_at=now,
            job_id=item.job_id,
            attempt=attempt,
            assignments=assignments,
            launch=launch,
            why=why,
        )
    ]
    placed = item.model_copy(
        update={
            "state": "placed",
            "attempt": attempt,
            "assignments": assignments,
            "exclude": (),
            "moving": False,
            "memory_gb": memory,
            "waited_s": item.waited_until(now),
        }
    )
    await queue.save(placed, events)
    log.info("job %s attempt %d placed on %s", item.job_id, attempt, ", ".join(a.node_id for a in assignments))


async def pull_back(job_id: str, source: str, target: str, *, queue: JobQueue, fleet: Fleet) -> None:
    """Snapshot the job on the rented node and keep the owned one for it; the rented node goes once empty."""
    item = queue.items.get(job_id)
    if item is None or item.state != "placed" or item.moving:
        return
    await fleet.reserve(target, job_id)
    await fleet.release_when_idle(source)
    await _snapshot(item, queue, cause="reclaimed", tag="reclaimed")
    log.info("pulling %s back from %s to %s", job_id, source, target)


async def make_room(
    job_id: str, instance_type: str, count: int, *, queue: JobQueue, fleet: Fleet, inputs: PolicyInputs
) -> None:
    """Rent for a running job that leaves an owned GPU to jobs that may only run there, then snapshot it: once the
    agent requeues it (cause "migrated") it avoids the nodes it left and is kept to the nodes rented for it. Billing
    refusing the rental leaves the job where it is."""
    item = queue.items.get(job_id)
    if item is None or item.state != "placed" or item.moving:
        return
    rented = await fleet.provision(
        instance_type,
        count,
        job_id=job_id,
        project_id=item.project_id,
        user_name=item.user_name,
        expected_hours=inputs.hours(item),
    )
    if not rented:
        return
    await _snapshot(item, queue, cause="migrated", tag="make-room")
    log.info(
        "moving %s to %s to make room on %s", job_id, ", ".join(rented), ", ".join(a.node_id for a in item.assignments)
    )


async def _snapshot(item: QueueItem, queue: JobQueue, *, cause: Literal["reclaimed", "migrated"], tag: str) -> None:
    """Mark the placed job moving and ask its agent to snapshot it, in one write (the id is one per attempt)."""
    event = JobMigrateRequested(
        event_id=f"{item.job_id}:migrate:{tag}:{item.attempt}",
        job_id=item.job_id,
        requested_by="placement",
        cause=cause,
        attempt=item.attempt,
    )
    await queue.save(item.model_copy(update={"moving": True}), [event])
