"""Inputs of the placement policy: nodes, on-demand instance types, jobs and the cluster snapshot."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from shared.jobs import host_memory_gb, task_cpus

NodeKind = Literal["local", "reserved", "on_demand"]
Allowed = Literal["local", "cloud", "any"]
Priority = Literal["time", "cost"]

OWNED_KINDS: frozenset[str] = frozenset({"local", "reserved"})
KINDS_FOR_ALLOWED: dict[str, tuple[str, ...]] = {
    "local": ("local",),
    "cloud": ("reserved", "on_demand"),
    "any": ("local", "reserved", "on_demand"),
}


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the policy sees it; `free_gpu_indices` are the GPUs no job holds."""

    id: str
    kind: NodeKind
    gpu_model: str
    gpu_count: int
    gpu_memory_gb: float
    tflops: float
    cpu: float
    memory_gb: float
    price_per_hour: float
    free_gpu_indices: tuple[int, ...]
    free_cpu: float
    free_memory_gb: float
    labels: Mapping[str, str] = field(default_factory=dict)
    pool: str = "default"
    instance_type: str | None = None
    ready_at: float | None = None
    idle_since: float | None = None
    reserved_for: str | None = None
    spot: bool = False  # a rented spot node: can be taken back, so only jobs that checkpoint may run on it

    def __post_init__(self) -> None:
        if self.kind not in ("local", "reserved", "on_demand"):
            raise ValueError(f"node {self.id}: unknown kind {self.kind!r}")
        if any(not 0 <= i < self.gpu_count for i in self.free_gpu_indices):
            raise ValueError(f"node {self.id}: free GPUs {self.free_gpu_indices} outside 0..{self.gpu_count - 1}")

    @property
    def free_gpus(self) -> int:
        return len(self.free_gpu_indices)

    def is_ready(self, now: float) -> bool:
        return self.ready_at is None or self.ready_at <= now


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One on-demand offer of the cloud catalogue."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gb: float
    tflops: float
    cpu: float
    memory_gb: float
    price_per_hour: float
    startup_delay_s: float
    spot: bool = False  # can be taken back at short notice: only for jobs that checkpoint (policy/spot.py)
    interruptions_per_hour: float | None = None  # spot only: the market's hazard; None: spot.DEFAULT_...


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job waiting for GPUs; `gpu_count` is per node (rank), `gpu_models` empty means any model; a job of
    `gpu_count` 0 needs no GPU (`engine.place` gives it to `cpu.place_cpu_jobs`, never to `schedule`).

    `exchange_rate` (dollars per GPU-hour sooner; None = the config's) is the project's; `duration_sigma` is the
    spread of the duration estimate (log-normal sigma; 0 = known).
    """

    id: str
    user: str
    submitted_at: float
    expected_duration_s: float
    allowed: Allowed = "any"
    priority: Priority = "time"
    gpu_count: int = 1
    min_gpu_memory_gb: float = 0.0
    gpu_models: frozenset[str] = frozenset()
    node_count: int = 1
    max_price_per_hour: float | None = None
    deadline: float | None = None
    predicted_duration_s: float | None = None
    cpu: float = 0.0
    # Whether a rank with GPUs takes at least its GPUs' share of a node's CPUs (`shared.jobs.task_cpus`), as the agent
    # gives it: every job placement places; the simulator's trace jobs take what they asked (the trace's cluster).
    cpus_at_gpu_share: bool = False
    memory_gb: float | None = 0.0  # None: its GPUs' share of each node's memory (shared.jobs.host_memory_gb)
    exchange_rate: float | None = None
    duration_sigma: float = 0.0
    checkpoint_interval_s: float | None = None  # declared by the owner; None: does not checkpoint, never spot
    # A job queued again after it ran (a spot interruption, a move, a lost node): when it last entered the queue
    # (None: at its submission) and the seconds it waited in the queue before that (`options.waited_s`).
    queued_at: float | None = None
    waited_before_s: float = 0.0

    def __post_init__(self) -> None:
        if self.allowed not in KINDS_FOR_ALLOWED or self.priority not in ("time", "cost"):
            raise ValueError(f"job {self.id}: allowed={self.allowed!r} priority={self.priority!r}")
        if self.gpu_count < 0 or self.node_count < 1 or self.expected_duration_s < 0:
            raise ValueError(f"job {self.id}: needs gpu_count >= 0, node_count >= 1 and a duration >= 0")
        if (self.exchange_rate is not None and not self.exchange_rate >= 0) or not self.duration_sigma >= 0:
            raise ValueError(f"job {self.id}: exchange_rate and duration_sigma must be >= 0")

    @property
    def needs(self) -> tuple:
        """What decides which nodes and types can host the job (jobs alike in it fit alike): the key of the
        passes' caches of fits."""
        return (
            self.gpu_count,
            self.node_count,
            self.min_gpu_memory_gb,
            self.gpu_models,
            self.cpu,
            self.cpus_at_gpu_share,
            self.memory_gb,
            self.max_price_per_hour,
        )

    def duration_on(self, tflops: float, reference_tflops: float) -> float:
        """Seconds on GPUs of `tflops`; the estimator's prediction wins over the owner's expectation."""
        base = self.predicted_duration_s if self.predicted_duration_s is not None else self.expected_duration_s
        return base * reference_tflops / max(tflops, 1e-9)

    def cpu_on(self, node_cpu: float, node_gpus: int) -> float:
        """CPUs one rank takes on a node (or instance type) of this many CPUs and GPUs."""
        if not self.cpus_at_gpu_share:
            return self.cpu
        return task_cpus(self.cpu, gpus=self.gpu_count, node_cpus=node_cpu, node_gpus=node_gpus)

    def memory_on(self, node_memory_gb: float, node_gpus: int) -> float:
        """Host memory one rank takes on a node (or instance type) of this memory and GPU count."""
        return host_memory_gb(self.memory_gb, gpus=self.gpu_count, node_memory_gb=node_memory_gb, node_gpus=node_gpus)

    def accepts_model(self, gpu_model: str) -> bool:
        return not self.gpu_models or gpu_model in self.gpu_models

    def may_run_on(self, *, spot: bool) -> bool:
        """Spot capacity (a node or an offer) only for a job that declares a checkpoint interval."""
        return not spot or self.checkpoint_interval_s is not None


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs; `expected_end_at` comes from the estimator (or the owner's expectation). `moving`: it was
    asked to checkpoint and move (pull-back, make room); the nodes kept for it stay kept until it is queued again."""

    job: JobRequest
    node_ids: tuple[str, ...]
    gpu_indices: tuple[tuple[int, ...], ...]
    started_at: float
    expected_end_at: float
    moving: bool = False


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything one scheduling pass needs; `usage_by_user` is recent GPU-hours (decayed) per user."""

    nodes: tuple[Node, ...] = ()
    queue: tuple[JobRequest, ...] = ()
    running: tuple[RunningJob, ...] = ()
    catalogue: tuple[InstanceType, ...] = ()
    usage_by_user: Mapping[str, float] = field(default_factory=dict)
