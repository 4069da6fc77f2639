"""The driver's hands inside the submitter: trials are submitted through the one job-submission use case (caps,
admission, placeability, outbox), told to end as the terminate action does, and read through the job view and the
estimator's metrics; all through the same `Submitter` the routes call."""

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.jobs import JobCreate, Parameter
from shared.stored import readable_template
from services.submitter.errors import described
from services.submitter.refusals import NameTaken, Refused
from services.submitter.sealing import Unreadable
from services.submitter.searches.driver import Submitted
from services.submitter.searches.space import as_text
from services.submitter.usecases import SubmitJob, Submitter
from services.submitter.views import SECRET_VALUES

log = logging.getLogger(__name__)
MAX_POINTS = 20_000  # per trial: the early points decide hyperband's first rungs


def trial_body(
    search: dict[str, Any],
    *,
    trial: int,
    parameters: dict[str, Any],
    name: str,
    secrets: dict[str, str] | None = None,
) -> JobCreate:
    """The template with the trial's name and its values appended to algorithm.parameters, and the search's
    `secrets` (opened: `SubmitterPort.secrets`) for those its template names, validated as a job (ValidationError: a
    search stored before its template and space were held to 100 parameters together)."""
    body = JobCreate.model_validate(readable_template(search["spec"]["template"]))  # as stored: `shared.stored`
    fixed = list(body.algorithm.parameters)
    algorithm = body.algorithm.model_copy(
        update={
            "parameters": fixed + [Parameter(name=k, value=as_text(v)) for k, v in sorted(parameters.items())],
            "secrets": secrets or {},
            "secret_names": [],
        }
    )
    metadata = body.metadata.model_copy(
        update={"name": name, "description": f"trial {trial} of search {search['_id']} ({search['name']})"}
    )
    return JobCreate.model_validate(body.model_copy(update={"algorithm": algorithm, "metadata": metadata}).model_dump())


@dataclass
class SubmitterPort:
    submitter: Submitter

    async def submit(self, search: dict, *, trial: int, job_id: str, parameters: dict) -> None:
        repo = self.submitter.repo
        if await repo.exists(job_id):
            return  # submitted before a restart
        secrets = self.secrets(search)
        for name in (f"{search['name']}-{trial}", job_id):  # the readable name, or the id when a job took it
            try:  # a job no service would read
                body = trial_body(search, trial=trial, parameters=parameters, name=name, secrets=secrets)
            except ValidationError as exc:
                raise Submitted(f"406001 the trial's job is invalid: {exc.errors()[0]['msg']}", retry=False) from None
            try:
                await self.submitter.submit(
                    SubmitJob(
                        project_id=search["project_id"],
                        user_name=search["user_name"],
                        body=body,
                        job_id=job_id,
                        links={"search_id": search["_id"], "search_trial": trial},
                    )
                )
                return
            except NameTaken:
                if await repo.exists(job_id):
                    return
            except Refused as exc:  # quota, budget, queue caps, a service away: the trial waits and is asked again
                _, code, message, _ = described(exc)
                raise Submitted(f"{code} {message}", retry=exc.retry) from None
        raise Submitted(f"no free job name for trial {trial}", retry=False)

    def secrets(self, search: dict) -> dict[str, str]:
        """The search's secrets for a trial's job, every one its template names (each trial's job seals its own);
        `Submitted` where they cannot be opened (a key this replica does not hold: asked again) or are gone."""
        names = set(search["spec"]["template"].get("algorithm", {}).get("secret_names") or [])
        if not names:
            return {}
        sealed = search.get(SECRET_VALUES)
        sealer = self.submitter.sealer
        try:
            values = sealer.open(search["_id"], sealed) if isinstance(sealed, str) else {}
        except Unreadable as exc:  # a key another replica holds (asked again), or a value not sealed for it (never)
            raise Submitted(f"the search's secrets: {exc}", retry=not sealer.holds_key_of(str(sealed))) from None
        if set(values) != names:
            raise Submitted("the search's secrets are not kept any more", retry=False)
        return values

    async def job(self, job_id: str) -> dict | None:
        return await self.submitter.repo.job(job_id)

    async def points(self, job_id: str, *, metric: str) -> list[tuple[float, float, float | None]]:
        report = await self.submitter.metrics(job_id, max_points=MAX_POINTS, whole=False)
        series = next((s for s in report.series if s.name == metric), None)
        return [] if series is None else list(series.points)

    async def terminate(self, job_id: str, *, requested_by: str) -> None:
        await self.submitter.terminate(job_id, requested_by=requested_by)
