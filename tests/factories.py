"""Keyword-argument factories for test data, with unique names per call."""

import itertools
import uuid
from datetime import UTC, datetime
from typing import Any

from shared.events import (
    Assignment,
    JobPlaced,
    JobStatusChanged,
    JobSubmitted,
    Launch,
    LogChunk,
    LogLine,
    NodeProvisioned,
    StartTask,
    TaskExited,
    TaskPreparing,
    TaskStarted,
)
from shared.jobs import Algorithm, JobCreate, Phase, SecondaryPhase, Spec
from shared.nodes import Gpu, NodeInfo

_counter = itertools.count()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def unique(prefix: str = "job") -> str:
    return f"{prefix}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


def job_body(*, name: str | None = None, command: str = "true", validate: bool = False, **spec: Any) -> dict[str, Any]:
    """A POST /v2/{project}/training-jobs body."""
    resource = {
        k: spec.pop(k)
        for k in list(spec)
        if k in ("node_count", "gpu_count", "min_gpu_memory_gb", "cpu_count", "memory_gb", "flavor_id", "pool_id")
    }
    placement = {
        k: spec.pop(k)
        for k in list(spec)
        if k
        in (
            "allowed",
            "priority",
            "expected_duration_s",
            "gpu_models",
            "max_price_per_hour",
            "deadline",
            "checkpoint_interval_s",
        )
    }
    algorithm = {k: spec.pop(k) for k in list(spec) if k in ("engine", "code_dir", "boot_file", "inputs", "outputs")}
    metrics = spec.pop("metrics", [])
    body = {
        "kind": "job",
        "metadata": {"name": unique() if name is None else name},
        "algorithm": {
            "command": command,
            "metrics": metrics,
            "environments": spec.pop("environments", {}),
            "parameters": spec.pop("parameters", []),
            **algorithm,
        },
        "spec": {"resource": resource, "placement": placement, **spec},
    }
    if validate:
        JobCreate.model_validate(body)
    return body


def submitted(
    *, job_id: str | None = None, command: str = "true", node_count: int = 1, created: datetime = T0, **spec: Any
) -> JobSubmitted:
    job_id = job_id or unique()
    body = JobCreate.model_validate(job_body(command=command, node_count=node_count, **spec))
    return JobSubmitted(
        event_id=f"{job_id}:submitted",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        name=job_id,
        algorithm=body.algorithm,
        spec=body.spec,
        create_time=created,
    )


def placed(
    job_id: str,
    *,
    attempt: int = 1,
    nodes: tuple[str, ...] = ("n1",),
    command: str = "true",
    price: float | None = 1.0,
    kind: str = "local",
    gpus: int = 1,
    node_gpus: int = 0,
    gpu_tflops: float | None = None,
    gpu_indices: tuple[int, ...] = (),
    gpu_memory_gb: float = 0,
) -> JobPlaced:
    """A placement made at T0, each rank's node at `price` per hour with `node_gpus` GPUs (0: not said), `gpus`
    per rank (`gpu_indices` given, of `gpu_memory_gb` each)."""
    return JobPlaced(
        event_id=f"{job_id}:placed:{attempt}",
        occurred_at=T0,
        job_id=job_id,
        attempt=attempt,
        assignments=tuple(
            Assignment(
                rank=r,
                node_id=n,
                node_kind=kind,
                price_per_hour=price,
                node_gpu_count=node_gpus,
                gpu_indices=gpu_indices,
                gpu_memory_gb=gpu_memory_gb,
                gpu_tflops=gpu_tflops,
            )
            for r, n in enumerate(nodes)
        ),
        launch=Launch(algorithm=algorithm(command), spec=Spec.model_validate({"resource": {"gpu_count": gpus}})),
    )


def chunk(
    job_id: str,
    *,
    attempt: int = 1,
    rank: int = 0,
    node_id: str = "n1",
    seq: int = 0,
    lines: tuple[str, ...] = ("hello",),
    last: bool = False,
) -> LogChunk:
    """A chunk of a task's output as the agent of `node_id` ships it."""
    return LogChunk(
        event_id=f"{job_id}:{attempt}:{rank}:{node_id}:log:{seq}",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        seq=seq,
        lines=tuple(LogLine(t=float(seq), line=x) for x in lines),
        last=last,
    )


def started(job_id: str, *, attempt: int = 1, rank: int = 0, node_id: str = "n1", at: datetime = T0) -> TaskStarted:
    return TaskStarted(
        event_id=f"{job_id}:{attempt}:{rank}:started",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        node_kind="local",
        price_per_hour=1.0,
        gpu_count=1,
        project_id="p",
        user_name="alice",
        pid=123,
        started_at=at,
    )


def preparing(job_id: str, *, attempt: int = 1, rank: int = 0, node_id: str = "n1") -> TaskPreparing:
    return TaskPreparing(
        event_id=f"{job_id}:{attempt}:{rank}:preparing", job_id=job_id, attempt=attempt, rank=rank, node_id=node_id
    )


def exited(
    job_id: str,
    *,
    attempt: int = 1,
    rank: int = 0,
    node_id: str = "n1",
    code: int | None = 0,
    reason: str = "completed",
    at: datetime = T0,
) -> TaskExited:
    return TaskExited(
        event_id=f"{job_id}:{attempt}:{rank}:exited",
        job_id=job_id,
        attempt=attempt,
        rank=rank,
        node_id=node_id,
        exit_code=code,
        reason=reason,
        ended_at=at,
    )


def node(
    *,
    node_id: str | None = None,
    kind: str = "local",
    gpus: int = 1,
    gpu_memory_gb: float = 24,
    tflops: float = 100,
    cpu: float = 8,
    memory_gb: float = 32,
    price: float = 1.0,
) -> NodeInfo:
    return NodeInfo(
        node_id=node_id or unique("node"),
        kind=kind,
        cpu_count=cpu,
        memory_gb=memory_gb,
        price_per_hour=price,
        gpus=tuple(Gpu(index=i, model="GPU", memory_gb=gpu_memory_gb, tflops=tflops) for i in range(gpus)),
    )


def algorithm(command: str = "true") -> Algorithm:
    return Algorithm(command=command)


def spec(**kw: Any) -> Spec:
    return Spec.model_validate(kw)


def start_task(job_id: str, command: str = "true", *, node_id: str = "n1") -> StartTask:
    """The monitor's command to run attempt 1, rank 0 of a job on a node, as alice of project p."""
    return StartTask(
        event_id=f"{job_id}:1:0:start",
        node_id=node_id,
        job_id=job_id,
        attempt=1,
        project_id="p",
        user_name="alice",
        algorithm=algorithm(command),
        spec=spec(),
    )


def provisioned(node_id: str = "od", *, price: float = 4.0, gpus: int = 2, for_job_id: str = "j1") -> NodeProvisioned:
    """Placement's record of renting `node_id` (instance type x2) for project p, user ana, at T0."""
    return NodeProvisioned(
        event_id=f"{node_id}:provisioned",
        node_id=node_id,
        instance_type="x2",
        provider="fake",
        price_per_hour=price,
        gpu_count=gpus,
        provisioned_at=T0,
        for_job_id=for_job_id,
        project_id="p",
        user_name="ana",
    )


# One rentable instance type as a catalogue lists it (cluster.toml's [[instance_types]]): the tests' L4.
L4_ENTRY = {
    "name": "l4.1x",
    "gpus": 1,
    "gpu_model": "L4",
    "gpu_memory_gb": 24,
    "tflops": 121,
    "cpu": 4,
    "memory_gb": 16,
    "price_per_hour": 0.8,
}


def status_changed(
    job_id: str, phase: Phase, secondary: SecondaryPhase, *, version: int = 2, **fields: Any
) -> JobStatusChanged:
    """The monitor's status `version` of a job of alice's in project p, `fields` as given."""
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=version,
        phase=phase,
        secondary_phase=secondary,
        **fields,
    )


def requeued(job_id: str, cause: str, *, version: int = 5, attempt: int = 1) -> JobStatusChanged:
    """The monitor's status that puts a job's attempt back in the queue, for `cause` (node_lost, oom_gpu, ...)."""
    return status_changed(
        job_id, Phase.PENDING, SecondaryPhase.QUEUING, version=version, attempt=attempt, requeue_cause=cause
    )
