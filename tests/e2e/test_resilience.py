"""Crash every service in turn while jobs flow: no job is lost, none runs twice, the ledger matches."""

import asyncio
import signal
from collections import Counter

import httpx
import pytest

from services.stack.processes import SERVICES
from tests.conftest import eventually, wait_until_ready
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e
JOBS = 50


async def post_until_accepted(api: httpx.AsyncClient, url: str, body: dict) -> None:
    """Submit through a submitter that may be down; a 409 means an earlier try got through."""
    for _ in range(200):
        try:
            response = await api.post(url, json=body)
            if response.status_code in (201, 409):
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"could not submit {body['metadata']['name']}")


async def listing(api: httpx.AsyncClient, project: str) -> list[dict] | None:
    try:
        response = await api.get(f"/v2/{project}/training-jobs", params={"limit": 500})
        return response.json()["items"] if response.status_code == 200 else None
    except httpx.TransportError:
        return None


async def test_killing_each_service_while_50_jobs_flow_loses_none_and_runs_none_twice(api, project, stack, shared_dir):
    marker = shared_dir / "runs"
    marker.touch()
    marker.chmod(0o666)  # appended to by every job, each its own user
    url = f"/v2/{project}/training-jobs"

    async def submit_all() -> None:
        for _ in range(JOBS):
            body = job_body(name=unique("r"), command=f"echo $TRAINMASTER_JOB_ID >> {marker}; sleep 0.5")
            await post_until_accepted(api, url, body)
            await asyncio.sleep(0.05)

    async def chaos() -> list[str]:
        killed = []
        for service in SERVICES:
            await asyncio.sleep(0.6)
            stack.signal(service, signal.SIGKILL)
            killed.append(service)
            await asyncio.sleep(0.4)
            stack.start_service(service)
        return killed

    _, killed = await asyncio.gather(submit_all(), chaos())
    assert killed == list(SERVICES)

    async def all_finished():
        items = await listing(api, project)
        return (
            items
            if items
            and len(items) == JOBS
            and all(j["status"]["phase"] in ("Completed", "Failed", "Terminated") for j in items)
            else None
        )

    items = await eventually(all_finished, timeout_s=150, interval_s=1)
    assert Counter(j["status"]["phase"] for j in items) == {"Completed": JOBS}
    runs = Counter(marker.read_text().split())
    assert len(runs) == JOBS and set(runs.values()) == {1}, runs.most_common(3)
    assert {j["metadata"]["id"] for j in items} == set(runs)

    async def ledger_complete():
        try:
            usage = (await api.get(f"/v2/{project}/usage")).json()
        except httpx.TransportError:
            return None
        return usage if usage["total"]["attempts"] == JOBS and usage["open_attempts"] == 0 else None

    await eventually(ledger_complete, timeout_s=30)
    wait_until_ready(stack)
