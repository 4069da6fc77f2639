"""Request/reply contracts between the REST API and the services that own the answers."""
from datetime import datetime

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class UsageQuery(BaseModel):
    model_config = ConfigDict(frozen=True)

    project_id: str | None = Field(None, description="None: every project (admin).")
    start: datetime | None = None
    end: datetime | None = None


class UsageTotals(BaseModel):
    key: str = Field("", description="The user name or node kind the row is for; empty for the grand total.")
    attempts: int = 0
    seconds: float = 0
    gpu_hours: float = 0
    cost: float = 0


class UsageReport(BaseModel):
    project_id: str | None
    start: datetime | None
    end: datetime | None
    total: UsageTotals
    by_user: list[UsageTotals]
    by_node_kind: list[UsageTotals]
    open_attempts: int = Field(0, description="Attempts still running, charged up to now.")


class MetricsQuery(BaseModel):
    job_id: str
    max_points: int = Field(2000, ge=1, le=100_000, description="Per metric, the most recent ones.")


class MetricSeries(BaseModel):
    name: str
    target: float | None = None
    mode: str | None = None
    points: list[tuple[float, float, float | None]] = Field(description="(unix time, value, step or null)")


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
