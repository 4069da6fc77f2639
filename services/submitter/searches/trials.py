"""The driver's hands inside the submitter: trials are submitted through the one job-submission use case (caps,
admission, placeability, outbox), told to end as the terminate action does, and read through the job view and the
estimator's metrics."""
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request

from shared.bus import RPC_METRICS
from shared.jobs import JobCreate, Parameter
from shared.rpc import MetricsQuery, MetricsReport
from services.submitter.commands import send_terminate
from services.submitter.errors import ApiError
from services.submitter.rpc import ask
from services.submitter.searches.driver import Submitted
from services.submitter.searches.space import as_text
from services.submitter.submission import submit_job

log = logging.getLogger(__name__)
MAX_POINTS = 20_000  # per trial: the early points decide hyperband's first rungs
RETRY_STATUS = (403, 429, 503)  # quota, budget, queue caps, a service away: the trial waits and is asked again


def app_request(app: FastAPI) -> Request:
    """A request scope carrying only the app, for the use cases that read `request.app.state`."""
    return Request({"type": "http", "app": app, "method": "POST", "path": "/", "headers": [], "query_string": b""})


def trial_body(search: dict[str, Any], *, trial: int, parameters: dict[str, Any], name: str) -> JobCreate:
    """The template with the trial's name and its values appended to algorithm.parameters."""
    body = JobCreate.model_validate(search["spec"]["template"])
    fixed = list(body.algorithm.parameters)
    algorithm = body.algorithm.model_copy(update={"parameters": fixed + [
        Parameter(name=k, value=as_text(v)) for k, v in sorted(parameters.items())]})
    metadata = body.metadata.model_copy(update={"name": name, "description": f"trial {trial} of search "
                                                                              f"{search['_id']} ({search['name']})"})
    return body.model_copy(update={"algorithm": algorithm, "metadata": metadata})


@dataclass
class AppPort:
    app: FastAPI

    @property
    def repo(self):
        return self.app.state.repo

    async def submit(self, search: dict, *, trial: int, job_id: str, parameters: dict) -> None:
        if await self.repo.jobs.find_one({"_id": job_id}, {"_id": 1}):
            return  # submitted before a restart
        request = app_request(self.app)
        for name in (f"{search['name']}-{trial}", job_id):  # the readable name, or the id when a job took it
            body = trial_body(search, trial=trial, parameters=parameters, name=name)
            try:
                await submit_job(request, project_id=search["project_id"], user_name=search["user_name"], body=body,
                                 job_id=job_id, links={"search_id": search["_id"], "search_trial": trial})
                return
            except ApiError as exc:
                if exc.status == 409 and await self.repo.jobs.find_one({"_id": job_id}, {"_id": 1}):
                    return
                if exc.status == 409:
                    continue
                raise Submitted(f"{exc.code} {exc.message}", retry=exc.status in RETRY_STATUS) from None
        raise Submitted(f"no free job name for trial {trial}", retry=False)

    async def job(self, job_id: str) -> dict | None:
        return await self.repo.jobs.find_one({"_id": job_id})

    async def points(self, job_id: str, *, metric: str) -> list[tuple[float, float, float | None]]:
        report = MetricsReport.model_validate(await ask(app_request(self.app), RPC_METRICS,
                                                        MetricsQuery(job_id=job_id, max_points=MAX_POINTS)))
        series = next((s for s in report.series if s.name == metric), None)
        return [] if series is None else [tuple(p) for p in series.points]

    async def terminate(self, job_id: str, *, requested_by: str) -> None:
        await send_terminate(self.app.state.broker, self.repo, job_id=job_id, requested_by=requested_by)
