"""The submitter's use cases, one object built once at start (`app.py`): plain values in, a job view out, or a
domain refusal (`refusals`). Nothing here knows HTTP: the routes, the ModelArts v1 dialect and a search's trials
call the same methods.

One submission asks placement for candidates once and billing once: the price billing admits against is the
price placement's candidates gave, and the same answer says whether anything could ever hold the job.
"""

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.bus import RPC_METRICS, RPC_MIGRATE, RPC_TERMINATE, publish
from shared.clock import utcnow
from shared.events import JobDeleted, JobMigrateRequested, JobSubmitted, JobTerminateRequested
from shared.jobs import FINISHED, JobCreate, unnamable
from shared.rpc import CandidatesReply, MetricsQuery, MetricsReport
from shared.storage import StoragePolicy, refused_addresses, refused_urls
from services.submitter import admission, feasible
from services.submitter.caps import QueueCaps
from services.submitter.catalogue import resolve
from services.submitter.commands import send_command
from services.submitter.intake import Arrival, Intake
from services.submitter.refusals import Invalid, NameTaken, NotFinished, NotFound, ServiceAway, WrongPhase
from services.submitter.repository import Repository
from services.submitter.rpc import Requester
from services.submitter.sealing import Sealer
from services.submitter.views import Job, carried, new_job, render

log = logging.getLogger(__name__)
FINISHED_NAMES = [p.value for p in FINISHED]


@dataclass(frozen=True)
class SubmitJob:
    """Submit a job for a user of a project. `job_id` (a search's deterministic trial id) and `links` (stored
    fields such as `search_id`) are optional."""

    project_id: str
    user_name: str
    body: JobCreate
    job_id: str | None = None
    links: dict[str, Any] = field(default_factory=dict)


@dataclass
class Submitter:
    repo: Repository
    intake: Intake
    caps: QueueCaps
    storage: StoragePolicy  # the URLs jobs may use, as the agents check
    requester: Requester
    sealer: Sealer  # a job's secrets encrypted before they are stored

    async def prepare(self, *, project_id: str, body: JobCreate) -> JobCreate:
        """Refuse names the task's environment cannot carry and storage the agents would refuse; fill a named
        flavor's resources, check a named pool."""
        if (unfit := unnamable(body.algorithm)) is not None:
            raise Invalid(*unfit)
        if body.algorithm.secret_names:
            raise Invalid("algorithm.secret_names", "is set by trainmaster: give the values in algorithm.secrets")
        refused = refused_urls(body.algorithm, policy=self.storage, project_id=project_id) or await refused_addresses(
            body.algorithm, policy=self.storage
        )
        if refused:  # outside the project's storage, the cluster's allow-list or public addresses: agents refuse too
            raise Invalid(*refused[0])
        return await resolve(self.requester, body)

    async def offers(self, body: JobCreate, *, project_id: str, user_name: str) -> CandidatesReply | None:
        """Placement's candidates for the job; None when placement does not answer (submissions go on without)."""
        try:
            return await self.requester.candidates(body, project_id=project_id, user_name=user_name)
        except ServiceAway as exc:
            log.warning("job priced at the default and taken without the placeability check: %s", exc.message)
            return None

    async def price_per_hour(self, body: JobCreate, *, project_id: str, user_name: str) -> float:
        """Dollars an hour of the job's run as admission prices it."""
        return admission.price_per_hour(body, await self.offers(body, project_id=project_id, user_name=user_name))

    async def submit(self, command: SubmitJob, *, before_store: Callable[[], Awaitable[None]] | None = None) -> Job:
        """Storage and flavors checked, caps, one pricing, one admission, placeability, `before_store` (what must
        be done before the job exists: its audit record stored, when an API request asks), store and announce; a
        taken name or id is NameTaken."""
        project_id, user_name = command.project_id, command.user_name
        body = await self.prepare(project_id=project_id, body=command.body)
        await self.caps.check(self.repo, project_id=project_id, user_name=user_name)  # before asking anyone
        answer = await self.offers(body, project_id=project_id, user_name=user_name)
        await admission.admit(self.requester, project_id=project_id, user_name=user_name, body=body, answer=answer)
        await feasible.refuse_unplaceable(self.requester, body.spec, answer, project_id=project_id, user_name=user_name)
        if before_store is not None:
            await before_store()
        return await self._store(command, body=body, job_id=command.job_id or str(uuid.uuid4()))

    async def _store(self, command: SubmitJob, *, body: JobCreate, job_id: str) -> Job:
        """Count the caps again and store the job with its event in one step, then announce it (or leave that to
        the outbox relay: the job is stored, its creation stands); both in groups with the jobs submitted
        alongside. A taken name (or id) is the repository's NameTaken."""
        project_id, user_name, now = command.project_id, command.user_name, utcnow()
        secrets = body.algorithm.secrets  # sealed before anything holds them: never in the document in the clear
        sealed = self.sealer.seal(job_id, secrets) if secrets else None
        doc = {
            **new_job(job_id=job_id, project_id=project_id, user_name=user_name, body=body, now=now, sealed=sealed),
            **command.links,
        }
        event = JobSubmitted(
            event_id=f"{job_id}:submitted",
            occurred_at=now,
            job_id=job_id,
            project_id=project_id,
            user_name=user_name,
            name=body.metadata.name,
            algorithm=carried(body.algorithm),  # the secrets' names, not their values
            spec=body.spec,
            create_time=now,
        )
        entries = await self.intake.store(Arrival(doc, event))  # the caps counted again, with the jobs alongside
        try:
            await self.intake.announce((job_id, entries))
        except Exception as exc:  # stored with its event in the outbox: the relay publishes it
            log.warning("job %s stored, its announcement left to the outbox relay: %r", job_id, exc)
        return render(doc, now=now)

    async def dry_run(self, *, project_id: str, user_name: str, body: JobCreate) -> dict[str, Any]:
        """The body is valid, the name is free, and here is where it could run, how long, at what cost."""
        body = await self.prepare(project_id=project_id, body=body)
        if await self.repo.name_taken(project_id, body.metadata.name):
            raise NameTaken(body.metadata.name, project_id=project_id)
        answer = await self.requester.candidates(body, project_id=project_id, user_name=user_name)
        await feasible.check(
            body.spec, answer, feasible.asker(self.requester, project_id=project_id, user_name=user_name)
        )
        return {
            "dry_run": True,
            "valid": True,
            "project_id": project_id,
            "name": body.metadata.name,
            **answer.model_dump(mode="json"),
        }

    async def stored(self, project_id: str, job_id: str) -> dict[str, Any]:
        """The job as stored; NotFound when the project has no such job."""
        doc = await self.repo.get(project_id, job_id)
        if doc is None:
            raise NotFound(job_id)
        return doc

    async def act(
        self, *, project_id: str, job_id: str, action: Literal["terminate", "migrate"], requested_by: str
    ) -> Job:
        """Ask the monitor to terminate the job, or to migrate it (only a Running job moves); the job as it is
        after the monitor's answer (or as it was, when the command waits on the stream)."""
        doc = await self.stored(project_id, job_id)
        phase = doc["status"]["phase"]
        if phase in FINISHED_NAMES or (action == "migrate" and phase != "Running"):
            raise WrongPhase(
                job_id, phase=phase, done=f"{action}d", hint=" (only Running jobs move)" if action == "migrate" else ""
            )
        if action == "terminate":
            await self.terminate(job_id, requested_by=requested_by)
        else:
            command = JobMigrateRequested(
                event_id=f"{job_id}:migrate:{uuid.uuid4().hex}",
                job_id=job_id,
                requested_by=requested_by,
                attempt=doc["status"].get("attempt"),
            )
            await send_command(self.requester.broker, self.repo, command, RPC_MIGRATE)
        return render(await self.stored(project_id, job_id))

    async def terminate(self, job_id: str, *, requested_by: str) -> None:
        """Terminate a job on someone's behalf (its user, a search pruning its trial); the job's reason names
        them."""
        command = JobTerminateRequested(
            event_id=f"{job_id}:terminate:{uuid.uuid4().hex}", job_id=job_id, requested_by=requested_by
        )
        await send_command(self.requester.broker, self.repo, command, RPC_TERMINATE)

    async def delete(
        self, *, project_id: str, job_id: str, check: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    ) -> None:
        """Delete a finished job: announced first (a finished job stays finished), so a failed publish deletes
        nothing and the call can be repeated, where a delete first would lose the announcement with the record
        that could carry it. `check`: what else may refuse it, given the stored job (a search's trial)."""
        doc = await self.stored(project_id, job_id)
        if doc["status"]["phase"] not in FINISHED_NAMES:
            raise NotFinished(job_id, phase=doc["status"]["phase"])
        if check is not None:
            await check(doc)
        await publish(self.requester.broker, JobDeleted(event_id=f"{job_id}:deleted", job_id=job_id))
        await self.repo.delete(job_id, finished=FINISHED_NAMES)

    async def metrics(self, job_id: str, *, max_points: int, whole: bool = True) -> MetricsReport:
        """The estimator's metric curves of the job."""
        query = MetricsQuery(job_id=job_id, max_points=max_points, whole=whole)
        return MetricsReport.model_validate(await self.requester.ask(RPC_METRICS, query))
