"""Every message on the bus: frozen pydantic models, events in the past tense, commands imperative.

Each class names its subject; `event_id` doubles as the JetStream message id, so a message published twice
(a retry, an outbox relay after a crash) is stored once.
"""

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from shared.clock import utcnow
from shared.jobs import FINISHED, Algorithm, Phase, SecondaryPhase, Spec
from shared.noderecords import NodeLimits
from shared.nodes import NodeInfo, Price

# Ids that become subjects and path segments (a job's directory, its checkpoint prefix): strict on the bus too.
Id = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$",
        description="Letters, digits, _ and -: one subject token, one path segment",
    ),
]
AttemptNo = Annotated[int, Field(ge=0, le=1_000_000)]
# Which run of an agent speaks (a fresh uuid hex at each start): a node's claim, bounded like every other.
BootId = Annotated[str, Field(max_length=64, description="The agent's run: a new one at each start of the agent")]
Silences = Annotated[
    int,
    Field(
        ge=0,
        le=1_000_000_000,
        description="How often the node went unheard past its fence window, over its agent's runs "
        "(services/agent/fence.py); a start issued at a lower count than the agent's is refused.",
    ),
]
RankNo = Annotated[int, Field(ge=0, le=65_535)]


def _cut(limit: int) -> BeforeValidator:
    """Text a node sends, cut to `limit` characters (not refused: an older agent's longer text still reads)."""
    return BeforeValidator(lambda value: value[:limit] if isinstance(value, str) else value)


Cut64 = Annotated[str, _cut(64)]
Cut128 = Annotated[str, _cut(128)]
MAX_EXIT_MESSAGE = 16_384  # a task's end: how it ended and its last lines (each a MiB at most: 20 MiB unbounded)
CutMessage = Annotated[str, _cut(MAX_EXIT_MESSAGE)]


class Message(BaseModel):
    """Tolerant on read (extra ignored) so an older reader survives a newer writer."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    subject_template: ClassVar[str]
    legacy_subject: ClassVar[str | None] = None  # where an earlier version published this type (accepted there)

    event_id: str = Field(description="Unique per logical message; the JetStream de-duplication id.")
    occurred_at: datetime = Field(default_factory=utcnow)

    @property
    def subject(self) -> str:
        return self.subject_template.format(**self.__dict__)


class TaskRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0


class Assignment(BaseModel):
    model_config = ConfigDict(frozen=True)

    rank: RankNo
    node_id: Id
    gpu_indices: tuple[int, ...] = ()
    # The node as placement's record had it when it placed the rank: what billing charges, never an agent's word.
    node_kind: str = Field("", description="The node's kind in placement's record (empty: not said).")
    price_per_hour: float | None = Field(None, ge=0, description="The node's price per hour in placement's record.")
    node_gpu_count: int = Field(0, ge=0, description="GPUs of the whole node in placement's record (0: not said).")
    gpu_tflops: float | None = Field(
        None,
        ge=0,
        description="The measured speed of the slowest of the rank's GPUs "
        "in placement's record (`Gpu.speed`: bounded by the table); None: not measured "
        "(the estimator's own table stands).",
    )
    gpu_memory_gb: float = Field(
        0,
        ge=0,
        description="Memory of the largest of the rank's GPUs in placement's "
        "record (0: not said); what the rank's GPU telemetry is held to.",
    )
    gpu_model: str = Field(
        "",
        max_length=128,
        description="The model of the slowest of the rank's GPUs in placement's record (empty: not said); what "
        "the estimator records the run on, not the model the node's start names.",
    )


class TaskStatus(BaseModel):
    model_config = ConfigDict(frozen=True)

    task: str = Field(examples=["worker-0"])
    exit_code: int | None = None
    message: str = ""


class Attempt(BaseModel):
    """One try at running a job: where, when, and why it started and ended."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    node_ids: tuple[str, ...]
    placed_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    reason: str = Field(
        "started", description="Why it began: started, oom, slow, node_lost, migrated, reclaimed, hung."
    )
    outcome: str = Field("", description="How it ended: completed, failed, terminated, oom, node_lost, migrated, ...")


RequeueCause = Literal["node_lost", "oom_gpu", "oom_host", "migrated", "slow", "reclaimed", "stopped", "hung"]


class Eta(BaseModel):
    model_config = ConfigDict(frozen=True)

    remaining_s: float = Field(ge=0)
    finish_time: datetime
    low_s: float = Field(ge=0, description="10th percentile of remaining seconds.")
    high_s: float = Field(ge=0, description="90th percentile of remaining seconds.")
    method: str = Field(examples=["rate"], description="How the estimate was made.")
    progress: float | None = Field(None, ge=0, le=1, description="Fraction of the work done, when known.")
    updated_at: datetime = Field(default_factory=utcnow)
    until: Literal["target", "end"] = Field(
        "end", description="What the remaining time runs to: the declared target metric's value, or the job's end."
    )
    target: Literal["ahead", "reached", "unreachable"] | None = Field(
        None,
        description="A declared target: still ahead, reached (the time then runs to the job's end when its "
        "progress is known), or not reachable before the job's declared or printed end.",
    )
    done: float | None = Field(None, ge=0, description="Work done so far, in `unit`.")
    total: float | None = Field(None, gt=0, description="The job's whole work, in `unit`, when known.")
    unit: str | None = Field(None, max_length=16, description="What the job counts its work in (step, epoch, it).")
    rate: float | None = Field(None, ge=0, description="Units of work a second, lately.")
    source: str | None = Field(
        None,
        max_length=16,
        examples=["tqdm"],
        description="Where the progress was read: declaration, sdk, mllog, tqdm, keras, lightning, hf-trainer, steps.",
    )


# Jobs ---------------------------------------------------------------------------------------------------------


def _no_secret_values(algorithm: Algorithm) -> Algorithm:
    if algorithm.secrets:
        raise ValueError("a job's secret values never travel in an event (the agent asks the submitter for them)")
    return algorithm


# A job's algorithm as events carry it: its secrets' names only (`Algorithm.secret_names`), never their values,
# which stay with the submitter until the task's node asks (`shared.jobsecrets`).
CarriedAlgorithm = Annotated[Algorithm, AfterValidator(_no_secret_values)]


class JobSubmitted(Message):
    subject_template: ClassVar[str] = "tm.job.submitted"
    type: Literal["JobSubmitted"] = "JobSubmitted"

    job_id: Id
    project_id: Id
    user_name: str
    name: str
    algorithm: CarriedAlgorithm
    spec: Spec
    create_time: datetime


class JobTerminateRequested(Message):
    subject_template: ClassVar[str] = "tm.job.terminate"
    type: Literal["JobTerminateRequested"] = "JobTerminateRequested"

    job_id: str
    requested_by: str


class JobDeleted(Message):
    subject_template: ClassVar[str] = "tm.job.deleted"
    type: Literal["JobDeleted"] = "JobDeleted"

    job_id: str


class Launch(BaseModel):
    """What every rank of an attempt is started with; the monitor turns it into one StartTask per rank, under the
    project and user it stored for the job (never ones a placement names)."""

    model_config = ConfigDict(frozen=True)

    master_addr: str = Field("127.0.0.1", description="Rank 0's node address (torch.distributed's MASTER_ADDR).")
    master_port: int = Field(29500, ge=1, le=65_535)
    algorithm: CarriedAlgorithm
    spec: Spec = Field(description="The job's spec with the resources this attempt was placed for.")


class JobPlaced(Message):
    """Placement chose nodes for one attempt; all ranks start together or not at all. Placement decides, the
    monitor alone commands the agents: it starts the ranks when it accepts the placement."""

    subject_template: ClassVar[str] = "tm.job.placed"
    type: Literal["JobPlaced"] = "JobPlaced"

    job_id: Id
    attempt: int = Field(ge=1, le=1_000_000)  # as every attempt number (`AttemptNo`)
    assignments: tuple[Assignment, ...]
    launch: Launch
    why: str = Field(
        "",
        max_length=500,
        description="Why placement chose these nodes: the options it weighed and "
        "its rule (empty: not said, e.g. a pull-back).",
    )


# Where a monitor before the phase was in the subject published every status (`JobStatusChanged.legacy_subject`).
LEGACY_STATUS_SUBJECT = "tm.job.status"


class JobStatusChanged(Message):
    """The monitor's projection of a job changed; `version` grows by one with every change. Its subject names the
    phase and the secondary phase (`status_subjects`), so a reader is delivered only the statuses it acts on."""

    subject_template: ClassVar[str] = "tm.job.status.{phase}.{secondary_phase}"
    # Where a monitor before the phase was in the subject published every status: read, and accepted there, for
    # one version (statuses still in the stream when the platform is upgraded), never published there again.
    legacy_subject: ClassVar[str | None] = LEGACY_STATUS_SUBJECT
    type: Literal["JobStatusChanged"] = "JobStatusChanged"

    job_id: str
    project_id: str
    user_name: str
    version: int = Field(ge=1)
    phase: Phase
    secondary_phase: SecondaryPhase
    previous_phase: Phase | None = None
    reason: str = ""
    attempt: int = 0
    node_ids: tuple[str, ...] = ()
    start_time: datetime | None = None
    end_time: datetime | None = None
    task_statuses: tuple[TaskStatus, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    requeue_cause: RequeueCause | None = Field(None, description="Set when the job went back to the queue.")
    lost_node_ids: tuple[str, ...] = Field(
        (), description="Abnormal (Lost): the nodes of the attempt found gone; its other nodes were alive."
    )


def status_subjects(*phases: Phase | tuple[Phase, SecondaryPhase]) -> tuple[str, ...]:
    """The subjects of the statuses of these phases (a phase: any secondary phase of it; a pair: that one only),
    with the legacy subject (`JobStatusChanged.legacy_subject`): a consumer's filter for the statuses it acts on."""
    subjects = [f"tm.job.status.{p[0]}.{p[1]}" if isinstance(p, tuple) else f"tm.job.status.{p}.*" for p in phases]
    return (*subjects, LEGACY_STATUS_SUBJECT)


# Which statuses each reader acts on (its consumer is delivered no other; tests/unit/test_status_subjects.py holds
# each reader's handler to its list). An attempt ends only with a status of a finished phase, Abnormal or
# Pending[Queuing] (a requeue), so billing, which keeps how attempts ended, reads those; placement also reads
# Running (when the job started, for its fair share); the estimator, only a job's end.
ALL_STATUSES = ("tm.job.status.*.*", LEGACY_STATUS_SUBJECT)
FINISHED_STATUSES = status_subjects(*sorted(FINISHED))
ATTEMPT_END_STATUSES = status_subjects((Phase.PENDING, SecondaryPhase.QUEUING), Phase.ABNORMAL, *sorted(FINISHED))
PLACEMENT_STATUSES = status_subjects(
    (Phase.PENDING, SecondaryPhase.QUEUING), Phase.RUNNING, Phase.ABNORMAL, *sorted(FINISHED)
)


class JobMigrateRequested(Message):
    """Snapshot the job (SIGTERM: save now) and continue it elsewhere."""

    subject_template: ClassVar[str] = "tm.job.migrate"
    type: Literal["JobMigrateRequested"] = "JobMigrateRequested"

    job_id: str
    requested_by: str
    cause: Literal["migrated", "slow", "reclaimed"] = "migrated"
    attempt: int | None = Field(None, description="Only if this attempt is still the current one.")


class JobUnplaceable(Message):
    """No node of the fleet can ever host the job as it now needs (after an out-of-memory, say)."""

    subject_template: ClassVar[str] = "tm.job.unplaceable"
    type: Literal["JobUnplaceable"] = "JobUnplaceable"

    job_id: str
    reason: str


class Notification(Message):
    """Something about a job that needs a person."""

    subject_template: ClassVar[str] = "tm.notify.{project_id}"
    type: Literal["Notification"] = "Notification"

    project_id: str
    job_id: str
    user_name: str
    kind: Literal["oom_unplaceable", "slow_no_faster_option", "repeated_failures", "budget", "hung", "hung_failed"]
    message: str


# Tasks (one rank of one attempt, on one node) ------------------------------------------------------------------


class StartTask(Message):
    subject_template: ClassVar[str] = "tm.node.cmd.{node_id}.start"
    type: Literal["StartTask"] = "StartTask"

    node_id: Id
    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    gpu_indices: tuple[int, ...] = ()
    project_id: Id
    user_name: str
    algorithm: CarriedAlgorithm
    spec: Spec
    silences: Silences = 0  # the node's count when the monitor issued this start (its last report)


class StopTask(Message):
    subject_template: ClassVar[str] = "tm.node.cmd.{node_id}.stop"
    type: Literal["StopTask"] = "StopTask"

    node_id: Id
    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    reason: Cut128 = "terminated"
    grace_s: float = Field(10, ge=0, le=3600, allow_inf_nan=False)  # infinite: the task was never killed


class TaskStarted(Message):
    subject_template: ClassVar[str] = "tm.job.task.{node_id}.started"
    type: Literal["TaskStarted"] = "TaskStarted"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id
    node_kind: Cut64
    price_per_hour: Price
    gpu_count: int = Field(ge=0, le=65_535)
    node_gpu_count: int = Field(
        0,
        ge=0,
        le=65_535,
        description="GPUs of the whole node (0: not said); the attempt is charged its share of the node's price.",
    )
    gpu_model: Cut128 = ""
    world_size: int = Field(1, ge=1, le=65_536)
    project_id: Id
    user_name: Cut128
    pid: int = Field(ge=0, le=2**31)
    started_at: datetime
    boot_id: str = Field(
        "",
        max_length=64,
        description="The run of the agent that started the task: a restart of the agent loses only the tasks its "
        "earlier runs started.",
    )


class TaskPreparing(Message):
    """The agent is preparing the task: building its environment, fetching its code and inputs."""

    subject_template: ClassVar[str] = "tm.job.task.{node_id}.preparing"
    type: Literal["TaskPreparing"] = "TaskPreparing"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id


class TaskExited(Message):
    subject_template: ClassVar[str] = "tm.job.task.{node_id}.exited"
    type: Literal["TaskExited"] = "TaskExited"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id
    exit_code: int | None = Field(None, description="None when the task never started.")
    signal: int | None = None
    reason: Literal["completed", "failed", "terminated", "oom", "not_started", "start_failed"]
    oom: Literal["gpu", "host"] | None = Field(None, description="Which memory ran out, when reason is oom.")
    message: CutMessage = ""
    ended_at: datetime


class TaskHung(Message):
    """A task showed no sign of life for its hang timeout: no output line, no progress mark, no new checkpoint,
    and (where the node reads GPU utilisation) idle GPUs. One per quiet spell (`spell` counts them)."""

    subject_template: ClassVar[str] = "tm.job.task.{node_id}.hung"
    type: Literal["TaskHung"] = "TaskHung"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id
    spell: int = Field(ge=1, le=1_000_000, description="Which quiet spell of this task, from 1.")
    idle_s: float = Field(ge=0, le=10**9, description="Seconds since the task's last sign of life.")
    gpus_watched: bool = Field(False, description="Whether the node read its GPUs' utilisation (NVML).")
    progressed: bool = Field(
        False,
        description="Whether the attempt moved the job on before it went quiet: it "
        "saved a checkpoint of its own and showed life for at least its hang timeout.",
    )


class TaskResumed(Message):
    """A task reported hung showed a sign of life again."""

    subject_template: ClassVar[str] = "tm.job.task.{node_id}.resumed"
    type: Literal["TaskResumed"] = "TaskResumed"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id
    spell: int = Field(ge=1, le=1_000_000, description="The quiet spell that ended.")
    idle_s: float = Field(ge=0, le=10**9, description="How long the task was quiet.")


class NodeTasksLost(Message):
    """The tasks a node was running are gone (node silent, or its agent restarted), except those still alive.

    It travels in the jobs stream, behind every task event the node published before it went away, so a task
    that finished just before its node died is seen finishing, not lost."""

    subject_template: ClassVar[str] = "tm.job.node_lost"
    type: Literal["NodeTasksLost"] = "NodeTasksLost"

    node_id: Id
    cause: str
    alive: tuple[TaskRef, ...] = ()
    started_only: bool = Field(
        False,
        description="Only started tasks are lost: the node's agent restarted and "
        "will still receive the start commands it had not taken yet.",
    )
    boot_id: str = Field(
        "",
        max_length=64,
        description="With started_only: the agent's run now up; the tasks it started itself are not lost (their "
        "starts may be read before this).",
    )


JobEvent = Annotated[
    JobSubmitted
    | JobTerminateRequested
    | JobMigrateRequested
    | JobUnplaceable
    | JobDeleted
    | JobPlaced
    | JobStatusChanged
    | TaskPreparing
    | TaskStarted
    | TaskExited
    | NodeTasksLost
    | TaskHung
    | TaskResumed,
    Field(discriminator="type"),
]
NodeCommand = Annotated[StartTask | StopTask, Field(discriminator="type")]


# Nodes ---------------------------------------------------------------------------------------------------------


class NodeRegistered(Message):
    subject_template: ClassVar[str] = "tm.node.evt.{node.node_id}.registered"
    type: Literal["NodeRegistered"] = "NodeRegistered"

    node: NodeInfo
    boot_id: BootId
    silences: Silences = 0


MAX_GPU_READINGS = 64  # per heartbeat or telemetry sample: a bounded message whatever a node claims


class GpuReading(BaseModel):
    """One GPU as NVML read it at one moment: the node's claim, bounded here (a reading outside the bounds is
    dropped alone, `readings`); the receiver also holds memory to the GPU's recorded size."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0, lt=MAX_GPU_READINGS, description="The GPU's index on its node (NVML's).")
    util_percent: float = Field(
        ge=0, le=100, allow_inf_nan=False, description="Busy time over the driver's last sample period, percent."
    )
    memory_used_gb: float = Field(ge=0, le=1024, allow_inf_nan=False, description="Device memory in use, GiB.")
    power_w: float | None = Field(None, ge=0, le=10_000, allow_inf_nan=False, description="Power draw, watts.")
    temp_c: float | None = Field(None, ge=-50, le=200, allow_inf_nan=False, description="Core temperature, °C.")


def readings(raw: object) -> tuple[GpuReading, ...]:
    """The valid readings of a claimed list, one per GPU index (the first), at most MAX_GPU_READINGS; the rest
    dropped, so one bad figure never costs the message that carries it."""
    if not isinstance(raw, list | tuple):
        return ()
    kept: dict[int, GpuReading] = {}
    for item in raw[:MAX_GPU_READINGS]:
        try:
            reading = item if isinstance(item, GpuReading) else GpuReading.model_validate(item)
        except ValueError:
            continue
        kept.setdefault(reading.index, reading)
    return tuple(kept.values())


MAX_RUNNING = 1024  # tasks a heartbeat may list (a node runs one a GPU, or a few a CPU core)


class NodeHeartbeat(Message):
    subject_template: ClassVar[str] = "tm.node.evt.{node_id}.heartbeat"
    type: Literal["NodeHeartbeat"] = "NodeHeartbeat"

    node_id: Id
    boot_id: BootId
    silences: Silences = 0
    running: tuple[TaskRef, ...] = Field((), max_length=MAX_RUNNING)
    gpu_utilization: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    gpus: tuple[GpuReading, ...] = Field(
        (),
        description="Each GPU of the node as NVML read it for this beat (none "
        "where the node does not read NVML); invalid readings are dropped.",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _valid_only(cls, raw: object) -> tuple[GpuReading, ...]:
        return readings(raw)

    @field_validator("running", mode="after")
    @classmethod
    def _once_each(cls, running: tuple[TaskRef, ...]) -> tuple[TaskRef, ...]:
        """Each task once: a list of one rank 20,000 times was 20,000 stop commands (found by review)."""
        return tuple(dict.fromkeys(running))


class NodeCadence(Message):
    """The monitor's word to every agent (core NATS, not stored): heartbeat this often; a node silent for
    `timeout_s` is lost. Agents never go below their own configured interval."""

    subject_template: ClassVar[str] = "tm.node.cadence"
    type: Literal["NodeCadence"] = "NodeCadence"

    interval_s: float = Field(gt=0, le=60)
    timeout_s: float = Field(gt=0, le=3600)


class NodeStateChanged(Message):
    """The monitor's verdict on a node: ready while it heartbeats, lost after its timeout."""

    subject_template: ClassVar[str] = "tm.node.evt.state"
    type: Literal["NodeStateChanged"] = "NodeStateChanged"

    node_id: str
    state: Literal["ready", "lost"]
    last_seen: datetime


class NodeProvisioned(Message):
    """Placement created an on-demand node (billed from now until it is released, idle time included)."""

    subject_template: ClassVar[str] = "tm.node.evt.provisioned"
    type: Literal["NodeProvisioned"] = "NodeProvisioned"

    node_id: str
    instance_type: str
    provider: str = Field(examples=["local-process"])
    price_per_hour: float = Field(ge=0)
    gpu_count: int = Field(ge=0)
    provisioned_at: datetime
    for_job_id: str | None = Field(None, description="The job it was provisioned for.")
    project_id: str | None = None
    user_name: str | None = None
    limits: NodeLimits | None = Field(
        None,
        description="What the node may offer, from the instance type it was "
        "rented as: its registration is capped to this.",
    )


class NodeReleased(Message):
    """Placement gave an on-demand node back; billing stops charging for it."""

    subject_template: ClassVar[str] = "tm.node.evt.released"
    type: Literal["NodeReleased"] = "NodeReleased"

    node_id: str
    released_at: datetime
    reason: str = Field("idle", examples=["idle", "pulled back", "failed to start"])


class NodeInterrupted(Message):
    """The cloud is taking a spot node back (its agent read the notice): it gets no more work and is released;
    its agent snapshots and stops its tasks (SIGTERM), which are requeued and resume elsewhere."""

    subject_template: ClassVar[str] = "tm.node.evt.{node_id}.interrupted"
    type: Literal["NodeInterrupted"] = "NodeInterrupted"

    node_id: Id
    kind: Literal["interruption", "rebalance"] = "interruption"
    action: str = Field("terminate", max_length=40, examples=["terminate", "stop", "hibernate", "rebalance"])
    notice_time: str = Field("", max_length=40, description="When the cloud acts, as its notice says.")


NodeEvent = Annotated[
    NodeRegistered | NodeHeartbeat | NodeStateChanged | NodeProvisioned | NodeReleased | NodeInterrupted,
    Field(discriminator="type"),
]


# Output and estimates ------------------------------------------------------------------------------------------


class LogLine(BaseModel):
    model_config = ConfigDict(frozen=True)

    t: float = Field(
        ge=0, le=2**34, allow_inf_nan=False, description="Unix time at which the agent read the line."
    )  # 2**34: the year 2514
    s: Literal["out", "err"] = "out"
    line: str

    @field_validator("line")
    @classmethod
    def _encodable(cls, line: str) -> str:
        """Lone surrogates (a JSON escape, no UTF-8 at all) become `?`: every reader can encode, store and show
        the line (else the chunk holding it could not be stored)."""
        try:
            line.encode()
        except UnicodeEncodeError:
            return line.encode(errors="replace").decode()
        return line


class LogChunk(Message):
    subject_template: ClassVar[str] = "tm.log.{node_id}.{job_id}"
    type: Literal["LogChunk"] = "LogChunk"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id  # the node whose agent ran the task: its subject carries it
    seq: int = Field(ge=0, description="Chunk number within the task, from 0.")
    lines: tuple[LogLine, ...] = Field(max_length=1000)  # an agent ships 500 at most (`shipping`)
    last: bool = Field(
        False,
        description="The task's final chunk (sent, and stored by the stream, before its "
        "TaskExited): its output is complete once this and every chunk before it "
        "are stored.",
    )


class TaskTelemetry(Message):
    """A running task's GPUs as NVML read them, once a heartbeat (its agent's claim: a receiver keeps it only from
    the node the rank was placed on, for the GPUs it was given, within their recorded memory)."""

    subject_template: ClassVar[str] = "tm.telemetry.{node_id}.{job_id}"
    type: Literal["TaskTelemetry"] = "TaskTelemetry"

    job_id: Id
    attempt: AttemptNo
    rank: RankNo = 0
    node_id: Id
    seq: int = Field(ge=0, le=10**12, description="Sample number within the agent's run (its heartbeat count).")
    t: float = Field(ge=0, le=10**11, allow_inf_nan=False, description="Unix time the sample was read.")
    gpus: tuple[GpuReading, ...] = Field((), description="The task's GPUs; invalid readings are dropped.")
    process_memory_gb: float | None = Field(
        None,
        description="GPU memory the task's own processes hold on its "
        "GPUs, GiB, where NVML reports it per process (an invalid figure: "
        "None).",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _valid_only(cls, raw: object) -> tuple[GpuReading, ...]:
        return readings(raw)

    @field_validator("process_memory_gb", mode="before")
    @classmethod
    def _finite_or_none(cls, raw: object) -> float | None:
        if isinstance(raw, int | float) and not isinstance(raw, bool) and 0 <= raw <= MAX_GPU_READINGS * 1024:
            return float(raw)
        return None


class EtaEstimated(Message):
    subject_template: ClassVar[str] = "tm.eta.{job_id}"
    type: Literal["EtaEstimated"] = "EtaEstimated"

    job_id: str
    eta: Eta | None = Field(description="None once the job is finished or no estimate can be made.")
