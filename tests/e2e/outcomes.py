"""What a run of many jobs under faults must end with (the chaos and failover tests): every job finished, no two
attempts of a job overlapping, and the usage ledger exactly one line per attempt that ran."""

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import httpx

from services.stack.processes import Stack
from tests.conftest import eventually

FINISHED = ("Completed", "Failed", "Terminated")


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


async def all_finished(api, project: str, *, jobs: int, context: str = "", timeout_s: float = 180) -> list[dict]:
    """The project's jobs once all `jobs` are finished (AssertionError naming a few stuck ones otherwise)."""

    async def finished():
        items = await listing(api, project)
        return items if items and len(items) == jobs and all(j["status"]["phase"] in FINISHED for j in items) else None

    try:
        return await eventually(finished, timeout_s=timeout_s, interval_s=2)
    except AssertionError:
        items = await listing(api, project) or []
        stuck = [
            (j["metadata"]["id"], j["status"]["phase"], j["status"]["reason"], j["status"]["attempts"])
            for j in items
            if j["status"]["phase"] not in FINISHED
        ]
        raise AssertionError(f"{len(items)} jobs, not finished: {stuck[:3]} {context}") from None


def assert_attempts_never_overlapped(marker: Path, items: list[dict]) -> None:
    """Each job wrote "<job id> <attempt> <time>" lines to `marker` while it ran: every job ran, and no two of its
    attempts ran at the same time."""
    ticks: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in marker.read_text().splitlines():
        job_id, attempt, at = line.split()
        ticks[job_id][int(attempt)].append(float(at))
    assert set(ticks) == {j["metadata"]["id"] for j in items}
    recorded = {j["metadata"]["id"]: j["status"]["attempts"] for j in items}
    for job_id, attempts in ticks.items():
        spans = [(min(t), max(t)) for _, t in sorted(attempts.items())]
        for (_, end), (begin, _) in zip(spans, spans[1:]):
            assert end < begin, f"two attempts of {job_id} overlapped: {spans}; recorded: {recorded[job_id]}"


async def ledger_settles(api, project: str, *, timeout_s: float = 60) -> int:
    """Wait until the usage ledger holds one closed line per attempt that ran; returns how many ran."""
    ran = 0

    async def matches():  # both views settle: a fenced attempt that ran anyway is noted a little later
        nonlocal ran
        try:
            usage = (await api.get(f"/v2/{project}/usage")).json()
            jobs = await listing(api, project) or []
        except Exception:
            return None
        ran = sum(1 for j in jobs for a in j["status"]["attempts"] if a["start_time"])
        return usage if usage["total"]["attempts"] == ran and usage["open_attempts"] == 0 else None

    try:
        await eventually(matches, timeout_s=timeout_s, interval_s=1)
    except AssertionError:
        usage = (await api.get(f"/v2/{project}/usage")).json()
        raise AssertionError(f"ledger {usage['total']} open {usage['open_attempts']}, attempts run {ran}") from None
    return ran


@contextlib.asynccontextmanager
async def supervised_after(stack: Stack, faults: Coroutine[Any, Any, Any]) -> AsyncIterator["asyncio.Task[Any]"]:
    """Run `faults` (kills, and restarts by hand) beside the body; once it is done, start again each process that
    exits on its own, as `make run`'s supervisor does (a service restarted the moment the bus went down may fail
    its start and exit). Yields the faults' task (await it for their result); on the way out, whatever is dead is
    started again, so the next test finds the stack whole even when this one failed."""
    faults_task = asyncio.ensure_future(faults)

    async def supervise() -> None:
        await asyncio.wait([faults_task])
        restarted: dict[str, float] = {}
        while True:
            stack.restart_dead(restarted)
            await asyncio.sleep(0.5)

    supervisor = asyncio.create_task(supervise())
    try:
        yield faults_task
    finally:
        supervisor.cancel()
        faults_task.cancel()
        await asyncio.gather(supervisor, faults_task, return_exceptions=True)
        stack.restart_dead({})
