"""The training job: what a researcher asks for (strict on write) and the phases it goes through.

State diagram (phases of ModelArts v2, seed 000; secondary phases in brackets):

    Creating ──► Pending[Queuing] ──► Running ──► Completed
       │             │   ▲  ▲           │  └────► Failed
       │             │   │  └───────────┤ (out of memory, migrate, slow, pull-back: snapshot, then re-place)
       │             │   │              │ (hung: Running[Hanging], then snapshot and re-place, or Failed)
       │             │   │              ├───────► Terminating ──► Terminated
       │             │   └── Abnormal[Lost] ◄───┘       └──────► Failed[TerminatedFailed]
       │             ├──► Terminating (placed, not yet started)
       │             ├──► Failed (no node can ever host it)
       │             └──► Terminated (never placed)
       └──► Failed[CreateFailed] / Terminated
"""

import re
import secrets
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict as StrictType,
    StringConstraints,
    field_validator,
    model_validator,
)

from shared.safe_regex import compile_metric

NAME_PATTERN = r"^[A-Za-z0-9_-]+$"
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
RESERVED_ENV_PREFIXES = ("TRAINMASTER_",)
RESERVED_ENV_NAMES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
)
MAX_PARAMETERS = 100  # a job's algorithm.parameters
MAX_SECRETS = 50  # a job's algorithm.secrets
MAX_SECRET_CHARS = 8192  # a variable's value (a secret's or its environment's)
# What the agent or an engine's preparation sets in every task's environment: a secret may not name one (one that
# reaches an agent anyway fails the start: `services/agent/supervision.py`)
AGENT_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "TMPDIR",
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "XDG_CACHE_HOME",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
    }
)
# A secret's value as given: never stripped of its whitespace (a PEM key's last newline is part of it)
SecretValue = Annotated[str, StringConstraints(strip_whitespace=False)]


def data_env_name(name: str) -> str:
    """An input's or an output's name as its variable names it (`TRAINMASTER_INPUT_<this>`)."""
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def unnamable(algorithm: "Algorithm") -> tuple[str, str] | None:
    """(field, reason) where a new job names its parameters or data as the task's environment cannot carry them: a
    parameter named as a variable trainmaster sets (it would be overwritten), or two inputs (or outputs) that are one
    variable (`a.b` and `a_b`: the last would win). Checked at submission, not by the model: a job stored or in a
    stream before these checks still reads back."""
    if taken := sorted(p.name for p in algorithm.parameters if reserved_env(p.name)):
        return "algorithm.parameters", f"parameter {taken[0]!r} is an environment variable trainmaster sets"
    for kind, items in (("inputs", algorithm.inputs), ("outputs", algorithm.outputs)):
        variables: dict[str, str] = {}
        for item in items:
            if (other := variables.setdefault(data_env_name(item.name), item.name)) != item.name:
                return f"algorithm.{kind}", f"{other!r} and {item.name!r} are one variable: name them apart"
    return None


def checked_variables(kind: str, variables: dict[str, str], *, taken: Callable[[str], bool]) -> dict[str, str]:
    """A job's variables (its environment, its secrets): each named as a variable may be, none trainmaster sets
    (`taken`), each value at most `MAX_SECRET_CHARS`; a refusal names the variable, never its value."""
    for name, value in variables.items():
        if not re.match(ENV_NAME_PATTERN, name):
            raise ValueError(f"{kind} name {name!r} is not valid")
        if taken(name):
            raise ValueError(f"{kind} {name!r} is set by trainmaster and cannot be overridden")
        if len(value) > MAX_SECRET_CHARS:
            raise ValueError(f"{kind} {name!r} is longer than {MAX_SECRET_CHARS} characters")
    return variables


def secret_taken(name: str) -> bool:
    """A name no secret may have: one trainmaster sets for every task, or the agent or a preparation does."""
    return reserved_env(name) or name in AGENT_ENV


def reserved_env(name: str) -> bool:
    """An environment variable the agent sets for every task (a job's own value would be overwritten)."""
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)


class Phase(StrEnum):
    CREATING = "Creating"
    PENDING = "Pending"
    RUNNING = "Running"
    FAILED = "Failed"
    COMPLETED = "Completed"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    ABNORMAL = "Abnormal"

    def is_finished(self) -> bool:
        return self in FINISHED


class SecondaryPhase(StrEnum):
    CREATING = "Creating"
    QUEUING = "Queuing"
    SCHEDULED = "Scheduled"
    PREPARING = "Preparing"
    RUNNING = "Running"
    FAILED = "Failed"
    COMPLETED = "Completed"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    CREATE_FAILED = "CreateFailed"
    TERMINATED_FAILED = "TerminatedFailed"
    UNKNOWN = "Unknown"
    LOST = "Lost"
    HANGING = "Hanging"  # Running, but no output, metric point or progress mark (and idle GPUs) for its timeout


FINISHED = frozenset({Phase.FAILED, Phase.COMPLETED, Phase.TERMINATED})

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.CREATING: frozenset({Phase.PENDING, Phase.FAILED, Phase.TERMINATED}),
    Phase.PENDING: frozenset({Phase.RUNNING, Phase.TERMINATING, Phase.TERMINATED, Phase.FAILED, Phase.ABNORMAL}),
    Phase.RUNNING: frozenset({Phase.COMPLETED, Phase.FAILED, Phase.TERMINATING, Phase.ABNORMAL, Phase.PENDING}),
    Phase.TERMINATING: frozenset({Phase.TERMINATED, Phase.FAILED}),
    Phase.ABNORMAL: frozenset({Phase.PENDING, Phase.FAILED, Phase.TERMINATED}),
    Phase.FAILED: frozenset(),
    Phase.COMPLETED: frozenset(),
    Phase.TERMINATED: frozenset(),
}


class IllegalTransition(ValueError):
    """A phase change the state machine does not allow."""


def check_transition(current: Phase, target: Phase) -> None:
    """Raise IllegalTransition unless current → target is an edge of the diagram."""
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(f"{current} → {target} is not allowed")


# JSON numbers only: `true` is not 1 and "1" is not 1 (pydantic's lax mode would take both); nor NaN or Infinity,
# which Python's JSON parser reads but no JSON answer can carry back.
Int = Annotated[int, StrictType()]
Float = Annotated[float, StrictType(), Field(allow_inf_nan=False)]


def no_null_bytes(value: Any, path: str = "") -> Any:
    """Refuse a NUL character anywhere in a string, a list or a mapping (keys included)."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(f"must not contain a null byte (\\u0000){f' at {path}' if path else ''}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            no_null_bytes(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            no_null_bytes(key, path or "a key")
            no_null_bytes(item, f"{path}.{key}" if path else str(key))
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    @field_validator("*", mode="after")
    @classmethod
    def _no_null_bytes(cls, value: Any) -> Any:
        return no_null_bytes(value)


class Parameter(Strict):
    name: str = Field(pattern=PARAM_NAME_PATTERN, description="Exported to the task's environment under this name.")
    value: str = Field(max_length=4096)


class MetricSpec(Strict):
    name: str = Field(pattern=PARAM_NAME_PATTERN, examples=["loss"])
    regex: str = Field(
        min_length=1,
        max_length=512,
        description="RE2 syntax (no backreferences or lookarounds), matched against the first 4096 characters of "
        "every output line; the named group `value` is the metric (or, without it, the pattern's one unnamed group: "
        "`loss=([0-9.]+)`), an optional named group `step` its progress.",
        examples=[r"step (?P<step>\d+) loss (?P<value>[0-9.eE+-]+)"],
    )
    mode: Literal["min", "max"] = Field("min", description="Whether the metric improves downwards or upwards.")
    target: Float | None = Field(
        None, ge=-1e15, le=1e15, description="Value at which training is done; drives the ETA."
    )

    @field_validator("regex")
    @classmethod
    def _compiles_with_a_group(cls, regex: str) -> str:
        compile_metric(regex)  # job output is matched in linear time: RE2, never a backtracking engine
        return regex


REQUIREMENT = (
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?"
    r"\s*((==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*,?\s*)*$"
)


def _stays_inside(path: str) -> str:
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError("must be a relative path that stays inside the attempt's directory")
    return path


RelativePath = Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]{1,255}$"), AfterValidator(_stays_inside)]
URL = Annotated[str, Field(min_length=1, max_length=2048, description="A local path, file://, s3://, http(s)://")]


class Engine(Strict):
    """The training environment: a catalogue entry by name, and/or packages to install, or a container image."""

    name: str | None = Field(None, pattern=PARAM_NAME_PATTERN, examples=["pytorch-cpu"])
    packages: list[Annotated[str, Field(pattern=REQUIREMENT, max_length=200)]] = Field(
        default_factory=list, max_length=50, description="pip requirements, pinned for a reusable cache."
    )
    image: str | None = Field(None, max_length=512, description="Used when the node runs Docker or Podman.")

    @model_validator(mode="after")
    def _something(self) -> "Engine":
        if not (self.name or self.packages or self.image):
            raise ValueError("an engine needs a name, packages or an image")
        return self


class DataIn(Strict):
    name: str = Field(pattern=PARAM_NAME_PATTERN, examples=["train_data"])
    url: URL
    local_dir: RelativePath | None = Field(None, description="Under the attempt's inputs/; default: its name")


class DataOut(Strict):
    name: str = Field(pattern=PARAM_NAME_PATTERN, examples=["model"])
    url: URL
    local_dir: RelativePath | None = Field(None, description="Under the attempt's outputs/; default: its name")
    mode: Literal["upload_periodically", "upload_at_end"] = "upload_periodically"
    period_s: Int = Field(30, ge=1, le=86400)


class Algorithm(Strict):
    command: str = Field(
        "", max_length=8192, description="Run with /bin/sh -c in the attempt's directory; default: python3 <boot_file>."
    )
    code_dir: URL | None = Field(None, description="Fetched into the attempt's code/ before it starts.")
    boot_file: RelativePath | None = Field(None, description="A file of code_dir to run.")
    engine: Engine | None = None
    inputs: list[DataIn] = Field(default_factory=list, max_length=20)
    outputs: list[DataOut] = Field(default_factory=list, max_length=20)
    parameters: list[Parameter] = Field(default_factory=list, max_length=MAX_PARAMETERS)
    environments: dict[str, str] = Field(default_factory=dict, max_length=100)
    secrets: dict[str, SecretValue] = Field(
        default_factory=dict,
        max_length=MAX_SECRETS,
        exclude_if=lambda v: not v,  # a reader of an older version (no such field) still reads a job without any
        description="Write-only: variables set in the task's environment only (API keys, tokens). The submitter "
        "keeps them apart until the job ends; they are never shown, never in an event, and masked in the job's "
        "output. Read back as `secret_names`.",
    )
    secret_names: list[str] = Field(
        default_factory=list,
        max_length=MAX_SECRETS,
        exclude_if=lambda v: not v,
        description="Set by trainmaster: the names of `secrets`.",
    )
    metrics: list[MetricSpec] = Field(default_factory=list, max_length=20)

    @model_validator(mode="after")
    def _something_to_run(self) -> "Algorithm":
        if not self.command and not self.boot_file:
            raise ValueError("command or boot_file is required")
        if self.boot_file and not self.code_dir:
            raise ValueError("boot_file needs code_dir")
        for kind, items in (("inputs", self.inputs), ("outputs", self.outputs)):
            names = [i.name for i in items]
            if len(names) != len(set(names)):
                raise ValueError(f"{kind} names must be unique")
        return self

    @field_validator("parameters")
    @classmethod
    def _unique_parameters(cls, parameters: list[Parameter]) -> list[Parameter]:
        names = [p.name for p in parameters]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate parameter names: {', '.join(duplicates)}")
        return parameters

    @field_validator("environments")
    @classmethod
    def _valid_environment_names(cls, environments: dict[str, str]) -> dict[str, str]:
        return checked_variables("environment variable", environments, taken=reserved_env)

    @field_validator("secrets")
    @classmethod
    def _valid_secret_names(cls, secrets: dict[str, str]) -> dict[str, str]:
        return checked_variables("secret", secrets, taken=secret_taken)

    @field_validator("secret_names")
    @classmethod
    def _valid_names_of_secrets(cls, names: list[str]) -> list[str]:
        checked_variables("secret", dict.fromkeys(names, ""), taken=secret_taken)
        return names

    @model_validator(mode="after")
    def _secrets_apart(self) -> "Algorithm":
        named = {*self.environments, *(p.name for p in self.parameters)}
        if both := sorted(named & {*self.secrets, *self.secret_names}):
            raise ValueError(f"{both[0]!r} is both a secret and a parameter or environment variable")
        return self

    @field_validator("metrics")
    @classmethod
    def _unique_metrics(cls, metrics: list[MetricSpec]) -> list[MetricSpec]:
        names = [m.name for m in metrics]
        if len(names) != len(set(names)):
            raise ValueError("metric names must be unique")
        return metrics


CPU_JOB_MEMORY_GB = 1.0  # a job without GPUs that names no host memory: enough for a script, not for CUDA


def host_memory_gb(asked: float | None, *, gpus: int, node_memory_gb: float, node_gpus: int) -> float:
    """The host memory a rank gets on a node: what the job asked for, else its GPUs' share of the node's memory
    (CUDA's own libraries take more than a GB of host memory), else the CPU job's default."""
    if asked is not None:
        return asked
    if gpus and node_gpus:
        return node_memory_gb * min(gpus, node_gpus) / node_gpus
    return CPU_JOB_MEMORY_GB


def task_cpus(cpu_count: float, *, gpus: int, node_cpus: float, node_gpus: int) -> float:
    """The CPUs a rank gets on a node (the agent pins it to as many and caps its CPU time there; placement counts
    as many against the node): what its job asked for, and at least its GPUs' share of the node's CPUs."""
    if gpus and node_gpus:
        return max(cpu_count, node_cpus * min(gpus, node_gpus) / node_gpus)
    return cpu_count


class Resource(Strict):
    node_count: Int = Field(1, ge=1, le=64, description="Nodes the job runs on, all at once (one rank each).")
    gpu_count: Int = Field(0, ge=0, le=16, description="GPUs per node.")
    min_gpu_memory_gb: Float = Field(0, ge=0, le=1024, description="Each GPU given has at least this memory.")
    cpu_count: Float = Field(
        1,
        gt=0,
        le=1024,
        description="CPU cores per node: each task runs pinned to, and its CPU time capped at, as many "
        "(a task with GPUs: at least its GPUs' share of the node's CPUs).",
    )
    memory_gb: Float | None = Field(
        None,
        gt=0,
        le=8192,
        description="Host memory per node; unset, a job with GPUs "
        "gets the node's memory in proportion to its GPUs (decided where it is placed), "
        f"a job without GPUs {CPU_JOB_MEMORY_GB:g} GB.",
    )
    flavor_id: str | None = Field(
        None,
        pattern=PARAM_NAME_PATTERN,
        description="Resources from a flavor (GET /v2/flavors); set by the API from the flavor.",
    )
    pool_id: str | None = Field(None, pattern=PARAM_NAME_PATTERN, description="Only nodes of this pool.")

    @model_validator(mode="after")
    def _gpu_memory_needs_gpus(self) -> "Resource":
        if self.min_gpu_memory_gb > 0 and self.gpu_count == 0:
            raise ValueError("min_gpu_memory_gb needs gpu_count of at least 1")
        return self


class PlacementPrefs(Strict):
    allowed: Literal["local", "cloud", "any"] = Field(
        "any", description="local: owned nodes; cloud: reserved or on-demand."
    )
    priority: Literal["time", "cost"] = Field("time", description="Finish soonest, or spend least.")
    expected_duration_s: Int | None = Field(None, ge=1, le=366 * 86400, description="The owner's expectation.")
    gpu_models: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=32, description="Acceptable GPU models; empty: any."
    )
    max_price_per_hour: Float | None = Field(None, gt=0, le=10_000, description="Most the job may cost per hour.")
    deadline: datetime | None = Field(None, description="When the job must be finished (ISO 8601).")
    checkpoint_interval_s: Int | None = Field(
        None,
        ge=1,
        le=7 * 86400,
        description="How often the job saves a checkpoint it resumes from (it also saves on "
        "SIGTERM). Declared, the job may run on spot capacity, which placement prices with the work an interruption "
        "loses; unset, the job never runs on spot.",
    )


class Spec(Strict):
    resource: Resource = Field(default_factory=Resource)
    placement: PlacementPrefs = Field(default_factory=PlacementPrefs)
    max_duration_s: Int | None = Field(None, ge=1, le=366 * 86400)
    termination_grace_s: Float = Field(10, ge=0, le=3600, description="Time between SIGTERM and SIGKILL.")
    hang_timeout_s: Int | None = Field(
        None,
        ge=0,
        le=366 * 86400,
        description="Seconds without an output line, metric point or progress mark "
        "(and with idle GPUs, where the node reads them) after which the job is suspected hung; 0 turns detection "
        "off; default: the cluster's (TRAINMASTER_HANG_TIMEOUT_S, 30 minutes).",
    )
    hang_restarts: Int = Field(
        3,
        ge=0,
        le=100,
        description="Restarts from the checkpoint after a hang, in a row "
        "(reset by an attempt that saved a checkpoint and showed life for at least its "
        "hang timeout before going quiet), before the job fails.",
    )


def generated_name() -> str:
    """`job-3f9a0c1e`: the name of a job submitted without one (a README run twice must not collide)."""
    return f"job-{secrets.token_hex(4)}"


class MetadataIn(Strict):
    name: str = Field(
        default_factory=generated_name,
        min_length=1,
        max_length=64,
        pattern=NAME_PATTERN,
        description="Letters, digits, `_` and `-`; unique per project among existing jobs; "
        "absent: `job-` and 8 random hex digits.",
    )
    description: str = Field("", max_length=256)
    workspace_id: str = Field("0", pattern=r"^[A-Za-z0-9_-]{1,64}$")


class JobCreate(Strict):
    """The body of POST /v2/{project_id}/training-jobs."""

    kind: Literal["job"] = "job"
    metadata: MetadataIn = Field(default_factory=MetadataIn)
    algorithm: Algorithm
    spec: Spec = Field(default_factory=Spec)
