"""The job as the API shows it (ModelArts v2 shape), and how stored jobs follow the monitor's events."""

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.clock import as_utc, utcnow
from shared.events import Eta, JobStatusChanged, TaskStatus
from shared.jobs import Algorithm, JobCreate, Phase, SecondaryPhase, Spec
from shared.stored import readable_algorithm


class JobMetadata(BaseModel):
    id: str
    name: str
    description: str
    create_time: int = Field(description="Milliseconds since the epoch, as ModelArts.")
    user_name: str
    workspace_id: str
    project_id: str


class AttemptView(BaseModel):
    attempt: int
    node_ids: list[str]
    placed_at: int
    start_time: int = 0
    end_time: int = 0
    reason: str = Field(description="started, oom, slow, node_lost, migrated, reclaimed, restarted")
    outcome: str = ""


class JobStatus(BaseModel):
    phase: Phase
    secondary_phase: SecondaryPhase
    duration: int = Field(description="Milliseconds the job has been running (so far).")
    start_time: int = Field(description="Milliseconds since the epoch; 0 before it starts.")
    end_time: int = 0
    node_id: str = Field("", description="The node of rank 0 of the current attempt.")
    node_ids: list[str] = []
    attempt: int = 0
    reason: str = ""
    tasks: list[str]
    task_statuses: list[TaskStatus] = []
    attempts: list[AttemptView] = Field([], description="Every try: node, start, end, why it began and ended.")
    eta: Eta | None = None


class Job(BaseModel):
    kind: Literal["job"] = "job"
    metadata: JobMetadata
    status: JobStatus
    algorithm: Algorithm
    spec: Spec


class JobList(BaseModel):
    total: int
    count: int
    offset: int
    limit: int
    items: list[Job]


def _ms(value: datetime | int | None) -> int:
    if isinstance(value, int):
        return value
    return int(as_utc(value).timestamp() * 1000) if value else 0


SECRET_VALUES = "secret_values"  # a job's secrets, sealed (`sealing`), beside it until it ends; never rendered


def carried(algorithm: Algorithm) -> Algorithm:
    """A job's algorithm as it is stored and as events carry it: its secrets' names, never their values."""
    if not algorithm.secrets:
        return algorithm
    return algorithm.model_copy(update={"secrets": {}, "secret_names": sorted(algorithm.secrets)})


def new_job(
    *, job_id: str, project_id: str, user_name: str, body: JobCreate, now: datetime, sealed: str | None = None
) -> dict[str, Any]:
    """The stored document of a just-submitted job: its algorithm with its secrets' names (`carried`), and apart
    from it `sealed`, its secrets as `sealing` sealed them, read by no view and opened only for the agents of its
    tasks (`services.submitter.secrets`)."""
    return {
        "_id": job_id,
        "project_id": project_id,
        "name": body.metadata.name,
        "description": body.metadata.description,
        "workspace_id": body.metadata.workspace_id,
        "user_name": user_name,
        "create_time": now,
        "algorithm": carried(body.algorithm).model_dump(),
        "spec": body.spec.model_dump(),
        "status": {"phase": Phase.CREATING.value, "secondary_phase": SecondaryPhase.CREATING.value},
        "status_version": 0,
        **({SECRET_VALUES: sealed} if sealed else {}),
    }


def aged(eta: dict[str, Any] | None, now: datetime) -> Eta | None:
    """The stored estimate as of `now`: its remaining seconds and band count down with the clock between the
    estimator's updates (which come with the job's output), its finish time stays."""
    if not eta:
        return None
    stored = Eta.model_validate(eta)
    elapsed = max(0.0, (now - as_utc(stored.updated_at)).total_seconds())
    return stored.model_copy(
        update={
            "remaining_s": max(0.0, stored.remaining_s - elapsed),
            "low_s": max(0.0, stored.low_s - elapsed),
            "high_s": max(0.0, stored.high_s - elapsed),
        }
    )


def stored_algorithm(raw: dict[str, Any]) -> Algorithm:
    """A stored job's algorithm as the API shows it: a metric this version refuses (`shared.stored`) left out, so the
    job and the page that lists it are still shown."""
    return Algorithm.model_validate(readable_algorithm(raw))


def render(doc: dict[str, Any], *, now: datetime | None = None) -> Job:
    status = doc.get("status", {})
    start, end = status.get("start_time"), status.get("end_time")
    now = now or utcnow()
    running_ms = _ms(end or now) - _ms(start) if start else 0
    node_ids = status.get("node_ids", [])
    node_count = doc["spec"]["resource"]["node_count"]
    return Job(
        metadata=JobMetadata(
            id=doc["_id"],
            name=doc["name"],
            description=doc["description"],
            create_time=_ms(doc["create_time"]),
            user_name=doc["user_name"],
            workspace_id=doc["workspace_id"],
            project_id=doc["project_id"],
        ),
        status=JobStatus(
            phase=status["phase"],
            secondary_phase=status["secondary_phase"],
            duration=max(0, running_ms),
            start_time=_ms(start),
            end_time=_ms(end),
            node_id=node_ids[0] if node_ids else "",
            node_ids=node_ids,
            attempt=status.get("attempt", 0),
            reason=status.get("reason", ""),
            tasks=[f"worker-{r}" for r in range(node_count)],
            task_statuses=status.get("task_statuses", []),
            attempts=status.get("attempts", []),
            eta=aged(status.get("eta"), now),
        ),
        algorithm=stored_algorithm(doc["algorithm"]),
        spec=Spec.model_validate(doc["spec"]),
    )


def status_fields(event: JobStatusChanged) -> dict[str, Any]:
    """`$set` of a status event onto the stored job; ETA goes once the job has finished."""
    fields: dict[str, Any] = {
        "status.phase": event.phase.value,
        "status.secondary_phase": event.secondary_phase.value,
        "status.reason": event.reason,
        "status.attempt": event.attempt,
        "status.node_ids": list(event.node_ids),
        "status.start_time": _ms(event.start_time),
        "status.end_time": _ms(event.end_time),
        "status.task_statuses": [t.model_dump() for t in event.task_statuses],
        "status.attempts": [
            {
                "attempt": a.attempt,
                "node_ids": list(a.node_ids),
                "placed_at": _ms(a.placed_at),
                "start_time": _ms(a.started_at),
                "end_time": _ms(a.ended_at),
                "reason": a.reason,
                "outcome": a.outcome,
            }
            for a in event.attempts
        ],
        "status_version": event.version,
    }
    if event.phase.is_finished():
        fields["status.eta"] = None
        fields[SECRET_VALUES] = {}  # no attempt of it starts again: its secrets are nobody's any more
    return fields
