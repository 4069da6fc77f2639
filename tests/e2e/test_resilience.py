"""Crash every service in turn while jobs flow: no job is lost, none runs twice, the ledger matches."""

import asyncio
import signal
from collections import Counter

import httpx
import pytest

from services.stack.processes import SERVICES
from tests.conftest import eventually, wait_until_ready
from tests.e2e.outcomes import all_finished, post_until_accepted, supervised_after
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e
JOBS = 50


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

    async with supervised_after(stack, chaos()) as faults:
        await submit_all()
        assert await faults == list(SERVICES)

        items = await all_finished(api, project, jobs=JOBS, timeout_s=150)
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
