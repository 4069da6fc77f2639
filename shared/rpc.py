"""Request/reply contracts between the REST API and the services that own the answers."""

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.jobs import Parameter, Spec

GroupBy = Literal["user", "node_kind", "node", "project"]


class UsageQuery(BaseModel):
    model_config = ConfigDict(frozen=True)

    project_id: str | None = Field(None, description="None: every project (admin).")
    start: datetime | None = None
    end: datetime | None = None
    group_by: GroupBy = Field("user", description="What the rows of `groups` are per.")
    user_name: str | None = Field(None, description="Only this user's attempts (quota checks).")
    job_id: str | None = Field(
        None,
        max_length=64,
        description="Only this job's attempts (its cost so far); idle time of rented nodes is then not counted.",
    )


class UsageTotals(BaseModel):
    key: str = Field("", description="The user name, node kind, node or project the row is for; empty for the total.")
    attempts: int = 0
    seconds: float = Field(0, description="Run time of attempts.")
    gpu_hours: float = 0
    cost: float = Field(0, description="Charged to attempts (node price x attempt time), every node kind.")
    local_gpu_hours: float = 0
    reserved_gpu_hours: float = 0
    owned_cost: float = Field(0, description="Amortised dollars of local and reserved nodes used by attempts.")
    on_demand_nodes: int = Field(0, description="On-demand nodes used by attempts or provisioned for the row.")
    on_demand_seconds: float = Field(
        0, description="Attempt run time on on-demand nodes plus idle time of nodes provisioned for the row."
    )
    on_demand_cost: float = Field(0, description="Dollars of on-demand nodes: attempts plus idle time.")
    spend: float = Field(0, description="owned_cost + on_demand_cost.")


class OwnedUsage(BaseModel):
    """Capacity of local or reserved nodes over the window: registration to loss, fleet-wide."""

    available_gpu_hours: float = 0
    busy_gpu_hours: float = 0
    idle_gpu_hours: float = 0
    utilisation: float | None = Field(None, description="busy / available; None when nothing was available.")
    amortised_cost: float = Field(0, description="Price per hour x time available.")


class OnDemandUsage(BaseModel):
    """On-demand nodes over the window, charged from provisioning to release, idle time included."""

    nodes: int = 0
    seconds: float = Field(0, description="Node run time (lifetimes clipped to the window).")
    cost: float = 0
    idle_cost: float = Field(0, description="Part of the cost no attempt used.")


class UsageReport(BaseModel):
    project_id: str | None
    start: datetime | None
    end: datetime | None
    total: UsageTotals
    by_user: list[UsageTotals]
    by_node_kind: list[UsageTotals]
    open_attempts: int = Field(0, description="Attempts still running, charged up to now.")
    group_by: GroupBy = "user"
    groups: list[UsageTotals] = Field(default_factory=list, description="One row per value of group_by.")
    owned: dict[str, OwnedUsage] = Field(default_factory=dict, description="Per owned kind: local, reserved.")
    on_demand: OnDemandUsage = Field(default_factory=OnDemandUsage)
    gpus_in_use: int = Field(0, description="GPUs held by running attempts (of the project/user asked about).")


class MetricsQuery(BaseModel):
    job_id: str
    max_points: int = Field(
        2000,
        ge=1,
        le=100_000,
        description="Per metric, the most recent ones (whole: the whole curve thinned to this many).",
    )
    whole: bool = Field(
        False,
        description="The whole curve, thinned (each slice's lowest and highest point), "
        "instead of the most recent points.",
    )


class MetricSeries(BaseModel):
    name: str
    target: float | None = None
    mode: str | None = None
    points: list[tuple[float, float, float | None]] = Field(description="(unix time, value, step or null)")
    system: bool = Field(
        False,
        description="A series the platform measured (GPU telemetry: gpu_util, "
        "gpu_memory_gb, gpu_memory_peak_gb, gpu_power_w, gpu_temp_c), not one the job printed.",
    )


class MetricsReport(BaseModel):
    job_id: str
    series: list[MetricSeries]


class AdmitQuery(BaseModel):
    """May this project/user spend this much? Asked before a job is accepted and before paying for a node."""

    model_config = ConfigDict(frozen=True)

    project_id: str
    user_name: str
    purpose: Literal["submit", "provision"]
    gpus: int = Field(0, ge=0, description="GPUs the job or node adds (for max_gpus).")
    estimated_cost: float = Field(0, ge=0, description="Dollars it is expected to cost.")
    estimated_gpu_hours: float = Field(0, ge=0)


class AdmitReply(BaseModel):
    allowed: bool
    reason: str = Field("", description="Why not, naming the quota or budget and what is left.")
    error_code: str = Field("", description="The API error code to answer with when refused.")
    http_status: int = Field(200, description="The HTTP status the API answers with when refused.")
    limited: bool = Field(False, description="Some quota or budget applies to this project or user.")


class Quota(BaseModel):
    """Limits of a project or of one user in it; None: no limit."""

    model_config = ConfigDict(extra="forbid")

    # bounded: stored by billing, and the database holds no integer past 2**63
    max_gpus: int | None = Field(None, ge=0, le=10**9, description="GPUs its running attempts may hold at once.")
    gpu_hours_per_month: float | None = Field(
        None, ge=0, le=1e15, allow_inf_nan=False, description="GPU-hours per calendar month (UTC)."
    )
    budget_per_month: float | None = Field(
        None,
        ge=0,
        le=1e15,
        allow_inf_nan=False,
        description="Dollars per calendar month (UTC), owned (amortised) and on-demand alike.",
    )


class ProjectQuotas(Quota):
    # keys are user names (their pattern): they become field names where billing stores the quotas
    users: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")], Quota] = Field(
        default_factory=dict, max_length=10_000, description="Per-user limits inside the project."
    )


class QuotasRequest(BaseModel):
    """Read a project's quotas; or replace them all (project); or one user's (user_name + user)."""

    project_id: str
    project: ProjectQuotas | None = None
    user_name: str | None = None
    user: Quota | None = None


class QuotasReply(BaseModel):
    project_id: str
    quotas: ProjectQuotas
    month_start: datetime
    used: UsageTotals = Field(description="The project's month to date.")
    used_by_user: list[UsageTotals] = Field(default_factory=list)
    gpus_in_use: int = 0


class CandidatesQuery(BaseModel):
    """Where could this job run, for how long and at what cost? (a dry run: nothing is created)."""

    spec: Spec
    user_name: str
    project_id: str
    parameters: list[Parameter] = Field(
        default_factory=list,
        max_length=100,
        description="The algorithm's "
        "parameters: `benchmark`, `batch_size` and `learning_rate` let placement "
        "ask the estimator for the duration, as it will once the job is queued.",
    )


class Candidate(BaseModel):
    node_kind: str
    node_id: str | None = Field(None, description="An existing node, or None for an instance type to rent.")
    instance_type: str | None = None
    gpu_model: str = ""
    gpus: int = 0
    memory_gb: float | None = Field(
        None,
        description="Host memory per node the job gets there (what it asked for, "
        "else its GPUs' share of the node's memory).",
    )
    price_per_hour: float = Field(description="The job's share of the node's price (all its ranks).")
    predicted_duration_s: float
    duration_source: Literal["estimator", "owner", "default"]
    expected_cost: float
    free_now: bool
    startup_delay_s: float = 0


class CandidatesReply(BaseModel):
    candidates: list[Candidate]
    unplaceable_kinds: dict[str, str] = Field(
        default_factory=dict, description="Allowed kinds with no node that could ever host the job, and why."
    )


class PredictQuery(BaseModel):
    """How long would this job take on that hardware? (the history model, before the job starts)"""

    benchmark: str = Field(examples=["bert"], description="Task or MLPerf benchmark name.")
    batch_size: float = 0
    learning_rate: float = 0
    accelerator: str = Field("unknown", examples=["NVIDIA H100-SXM5-80GB"])
    accelerators: int = Field(1, ge=1, description="Per node.")
    nodes: int = Field(1, ge=1)


class PredictReply(BaseModel):
    duration_s: float | None = None
    low_s: float | None = None
    high_s: float | None = None
    model_version: int | None = Field(None, description="None: no history model is trained yet.")


class Flavor(BaseModel):
    """A named shape of resources a job may ask for by `spec.resource.flavor_id`."""

    flavor_id: str
    gpu_model: str = ""
    gpu_count: int = 0
    gpu_memory_gb: float = 0
    tflops: float = 0
    cpu_count: float = 1
    memory_gb: float = 1
    price_per_hour: float | None = Field(None, description="Of the cheapest node of this shape, when known.")
    max_node_count: int = Field(1, description="How many nodes of this shape the fleet has (or may rent).")


class Pool(BaseModel):
    """A named group of nodes (a team's workstations, say); `spec.resource.pool_id` keeps a job inside it."""

    pool_id: str
    node_ids: list[str]
    kinds: list[str]
    gpus: int


class Catalogue(BaseModel):
    flavors: list[Flavor]
    pools: list[Pool]
