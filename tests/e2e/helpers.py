"""Driving jobs through the REST API."""

import httpx

from tests.conftest import eventually, wait_until_ready
from tests.factories import job_body


async def submit(api: httpx.AsyncClient, project: str, **body) -> dict:
    response = await api.post(f"/v2/{project}/training-jobs", json=job_body(**body))
    assert response.status_code == 201, response.text
    return response.json()


async def get(api: httpx.AsyncClient, project: str, job_id: str) -> dict:
    response = await api.get(f"/v2/{project}/training-jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def wait_phase(api: httpx.AsyncClient, project: str, job_id: str, *phases: str, timeout_s: float = 60) -> dict:
    async def reached():
        job = await get(api, project, job_id)
        return job if job["status"]["phase"] in phases else None

    return await eventually(reached, timeout_s=timeout_s)


async def logs(api: httpx.AsyncClient, project: str, job_id: str) -> str:
    response = await api.get(f"/v2/{project}/training-jobs/{job_id}/logs")
    assert response.status_code == 200, response.text
    return response.text


async def logs_containing(
    api: httpx.AsyncClient, project: str, job_id: str, *needles: str, timeout_s: float = 20
) -> str:
    """The job's log once every needle is in it (logs travel on their own stream, so a job can be Completed a
    moment before its last lines are stored); the log as it is when they never all come."""

    async def complete() -> str | None:
        text = await logs(api, project, job_id)
        return text if all(n in text for n in needles) else None

    try:
        return await eventually(complete, timeout_s=timeout_s, interval_s=0.3)
    except AssertionError:
        return await logs(api, project, job_id)


def restart_agent(stack, node_id: str) -> None:
    """Start a killed agent again and wait until the whole fleet is ready (the next test expects it)."""
    stack.start_agent(node_id)
    wait_until_ready(stack)
