"""A decision and a dry run on a synthetic cluster at placement's start, before it listens: whatever the engine's
first run pays once (lazy imports, first validations, the policy's first pass over each kind of job and node) is
paid then, not by the first job submitted. Nothing is applied, stored, published or asked of another service."""

import logging
import time
from datetime import UTC, datetime

from shared.jobs import Algorithm, Resource, Spec
from services.placement.candidates import candidates
from services.placement.inputs import PolicyInputs
from services.placement.policy import ClusterState, Decision, InstanceType, Node
from services.placement.policy.engine import place
from services.placement.queue import QueueItem

log = logging.getLogger(__name__)
NAME = "warm-up"  # no job, node, user or instance type of a cluster is ever read here: the state is built apart
NODES = (
    Node(
        id=f"{NAME}-gpu",
        kind="reserved",
        gpu_model=NAME,
        gpu_count=2,
        gpu_memory_gb=80,
        tflops=100,
        cpu=32,
        memory_gb=256,
        price_per_hour=2.0,
        free_gpu_indices=(0, 1),
        free_cpu=32,
        free_memory_gb=256,
    ),
    Node(
        id=f"{NAME}-cpu",
        kind="local",
        gpu_model="",
        gpu_count=0,
        gpu_memory_gb=0,
        tflops=0,
        cpu=64,
        memory_gb=256,
        price_per_hour=1.0,
        free_gpu_indices=(),
        free_cpu=64,
        free_memory_gb=256,
    ),
)
CATALOGUE = (
    InstanceType(
        name=NAME,
        gpus=8,
        gpu_model=NAME,
        gpu_memory_gb=80,
        tflops=100,
        cpu=96,
        memory_gb=1024,
        price_per_hour=30.0,
        startup_delay_s=120,
    ),
)


def jobs() -> list[QueueItem]:
    """A job without GPUs, one with a GPU, one that only a rented node could hold."""
    submitted = datetime.now(UTC)
    return [
        QueueItem(
            job_id=f"{NAME}-{gpus}",
            project_id=NAME,
            user_name=NAME,
            algorithm=Algorithm(command="true"),
            spec=Spec(resource=Resource(gpu_count=gpus, cpu_count=1, memory_gb=1)),
            submitted_at=submitted,
        )
        for gpus in (0, 1, 8)
    ]


def warm_up(inputs: PolicyInputs) -> list[Decision]:
    """The engine's decisions for the synthetic queue, and a dry run of its GPU job (the answer is dropped); none
    where the engine fails on it (logged: the first real pass then pays what is left, as before)."""
    try:
        return _decide(inputs)
    except Exception:
        log.exception("placement's warm-up decision failed; starting without it")
        return []


def _decide(inputs: PolicyInputs) -> list[Decision]:
    now = time.time()
    requests = tuple(inputs.job_request(item) for item in jobs())
    state = ClusterState(nodes=NODES, queue=requests, catalogue=CATALOGUE)
    config = inputs.config_now()
    decisions = place(state, now, config, {})
    candidates(state, requests[1], now=now, config=config, known=NODES, source="default")
    return decisions
