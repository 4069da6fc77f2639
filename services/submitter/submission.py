"""The one job-submission use case, whatever the dialect (v2, ModelArts v1, a search's trials), and its dry run.

One submission asks placement for candidates once and billing once: the price billing admits against is the
price placement's candidates gave, and the same answer says whether anything could ever hold the job.
"""
import logging
import uuid

from fastapi import Request

from shared.clock import utcnow
from shared.events import JobSubmitted
from shared.jobs import JobCreate
from shared.rpc import CandidatesReply
from shared.storage import refused_addresses, refused_urls
from services.submitter import admission, errors, feasible
from services.submitter.catalogue import resolve
from services.submitter.errors import ApiError
from services.submitter.intake import Arrival
from services.submitter.repository import NameTaken, Repository
from services.submitter.rpc import candidates
from services.submitter.views import Job, new_job, render

log = logging.getLogger(__name__)


def repo(request: Request) -> Repository:
    return request.app.state.repo


def name_taken(project_id: str, name: str) -> ApiError:
    return ApiError(409, errors.NAME_EXISTS, f"job name {name} already exists in project {project_id}")


async def prepare(request: Request, *, project_id: str, body: JobCreate) -> JobCreate:
    """Refuse storage the agents would refuse; fill a named flavor's resources, check a named pool."""
    storage = request.app.state.storage
    refused = refused_urls(body.algorithm, policy=storage, project_id=project_id) or \
        await refused_addresses(body.algorithm, policy=storage)
    if refused:  # outside the project's storage, the cluster's allow-list or public addresses: the agents refuse too
        raise ApiError(400, errors.PARAM_INVALID, f"param[{refused[0][0]}] invalid: {refused[0][1]}")
    return await resolve(request, body)


async def offers(request: Request, body: JobCreate, *, project_id: str, user_name: str) -> CandidatesReply | None:
    """Placement's candidates for the job; None when placement does not answer (submissions go on without it)."""
    try:
        return await candidates(request, body, project_id=project_id, user_name=user_name)
    except ApiError as exc:
        log.warning("job priced at the default and taken without the placeability check: %s", exc.message)
        return None


async def quote(request: Request, body: JobCreate, *, project_id: str, user_name: str) -> tuple[float, float]:
    """(dollars, GPU-hours) of the job as admission prices it."""
    return admission.price(body, await offers(request, body, project_id=project_id, user_name=user_name))


async def submit_job(request: Request, *, project_id: str, user_name: str, body: JobCreate,
                     job_id: str | None = None, links: dict | None = None) -> Job:
    """Storage and flavors checked, caps, one pricing, one admission, placeability, store and announce. `job_id`
    (a search's deterministic trial id) and `links` (stored fields such as `search_id`) are optional; a taken name
    or id is 409."""
    body = await prepare(request, project_id=project_id, body=body)
    caps = request.app.state.queue_caps
    await caps.check(repo(request), project_id=project_id, user_name=user_name)  # before asking anyone
    answer = await offers(request, body, project_id=project_id, user_name=user_name)
    await admission.admit(request, project_id=project_id, user_name=user_name, body=body, answer=answer)
    await feasible.refuse_unplaceable(request, body.spec, answer, project_id=project_id, user_name=user_name)
    return await store(request, project_id=project_id, user_name=user_name, body=body,
                       job_id=job_id or str(uuid.uuid4()), links=links or {})


async def store(request: Request, *, project_id: str, user_name: str, body: JobCreate, job_id: str,
                links: dict) -> Job:
    """Count the caps again and store the job with its event in one step, then announce it (or leave that to
    the outbox relay: the job is stored, the 201 stands); both in groups with the jobs submitted alongside."""
    intake, now = request.app.state.intake, utcnow()
    doc = {**new_job(job_id=job_id, project_id=project_id, user_name=user_name, body=body, now=now), **links}
    event = JobSubmitted(event_id=f"{job_id}:submitted", occurred_at=now, job_id=job_id, project_id=project_id,
                         user_name=user_name, name=body.metadata.name, algorithm=body.algorithm,
                         spec=body.spec, create_time=now)
    try:
        entries = await intake.store(Arrival(doc, event))  # the caps counted again, with the jobs stored alongside
    except NameTaken:
        raise name_taken(project_id, body.metadata.name) from None
    try:
        await intake.announce((job_id, entries))
    except Exception as exc:  # stored with its event in the outbox: the relay publishes it
        log.warning("job %s stored, its announcement left to the outbox relay: %r", job_id, exc)
    return render(doc, now=now)


async def estimate(request: Request, *, project_id: str, user_name: str, body: JobCreate) -> dict:
    """The dry run: the body is valid, the name is free, and here is where it could run, how long, at what cost."""
    body = await prepare(request, project_id=project_id, body=body)
    if await repo(request).jobs.find_one({"project_id": project_id, "name": body.metadata.name}, {"_id": 1}):
        raise name_taken(project_id, body.metadata.name)
    answer = await candidates(request, body, project_id=project_id, user_name=user_name)
    await feasible.check(body.spec, answer, feasible.asker(request, project_id=project_id, user_name=user_name))
    return {"dry_run": True, "valid": True, "project_id": project_id, "name": body.metadata.name,
            **answer.model_dump(mode="json")}
