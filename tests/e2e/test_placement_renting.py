"""Renting on-demand nodes: provisioned when waiting costs more time, released when idle, pulled back from."""

import asyncio
import time

import pytest

from tests.conftest import eventually
from tests.e2e.helpers import get, submit, wait_phase
from tests.e2e.scripts import counter
from tests.e2e.test_placement_rules import occupy, rented, terminate

pytestmark = pytest.mark.e2e


async def test_a_time_sensitive_job_rents_a_node_instead_of_waiting(client, project):
    blockers = [await occupy(client, project, kind) for kind in ("local", "cloud")]
    job = await submit(client, project, command="sleep 1", gpu_count=1, priority="time", expected_duration_s=1800)
    done = await wait_phase(client, project, job["metadata"]["id"], "Completed", timeout_s=60)
    assert done["status"]["node_ids"][0].startswith("od-g-small-")
    await terminate(client, project, *blockers)

    async def given_back():
        nodes = await rented(client)
        return nodes if nodes and all(n["state"] == "released" for n in nodes) else None

    await eventually(given_back, timeout_s=30)  # idle for 2 s: released
    released_by = time.time()

    async def charged():  # the rented node, from provisioning to release, idle time included, at its price
        report = (await client.get(f"/v2/{project}/usage")).json()
        return report if report["on_demand"]["nodes"] == 1 and report["on_demand"]["seconds"] > 0 else None

    report = await eventually(charged, timeout_s=30)
    lifetime = report["on_demand"]["seconds"]
    created = job["metadata"]["create_time"] / 1000
    assert 1 <= lifetime <= released_by - created + 1  # between rent and release (one heartbeat of slack)
    assert report["on_demand"]["cost"] == pytest.approx(lifetime * 2.0 / 3600, rel=1e-3)


async def test_a_job_on_a_rented_node_is_pulled_back_when_a_local_node_frees(client, project):
    local = await occupy(client, project, "local")
    reserved = await occupy(client, project, "cloud")
    # owned nodes free in an hour: renting at $2/h saves that hour's wait, worth more at the default exchange rate
    job = await submit(
        client, project, command=counter(total=3000, every=5, pause=0.1), gpu_count=1, expected_duration_s=1800
    )
    job_id = job["metadata"]["id"]
    running = await wait_phase(client, project, job_id, "Running", timeout_s=60)
    rented_node = running["status"]["node_ids"][0]
    assert rented_node.startswith("od-")
    await terminate(client, project, local)

    async def back_home():
        current = await get(client, project, job_id)
        attempts = current["status"]["attempts"]
        return current if len(attempts) == 2 and attempts[1]["start_time"] else None

    moved = await eventually(back_home, timeout_s=60)
    assert moved["status"]["attempts"][1]["reason"] == "reclaimed"
    assert moved["status"]["attempts"][1]["node_ids"] == ["lab-1"]

    async def released():
        return next((n for n in await rented(client) if n["node_id"] == rented_node and n["state"] == "released"), None)

    await eventually(released, timeout_s=30)
    await terminate(client, project, reserved, moved)


async def test_nothing_paid_is_provisioned_past_a_budget(client, project):
    # enough budget for the job on an owned node, not for an hour of a rented one
    assert (await client.put(f"/v2/{project}/quotas", json={"budget_per_month": 0.6})).status_code == 200
    blockers = [await occupy(client, f"{project}-other", kind) for kind in ("local", "cloud")]
    job = await submit(client, project, command="sleep 1", gpu_count=1, priority="time", expected_duration_s=3600)
    job_id = job["metadata"]["id"]
    await wait_phase(client, project, job_id, "Pending")
    for _ in range(8):  # a time-sensitive job that would rent at once, if renting were allowed
        assert (await get(client, project, job_id))["status"]["phase"] == "Pending"
        assert [n for n in await rented(client) if n["state"] != "released"] == []
        await asyncio.sleep(0.5)
    await terminate(client, f"{project}-other", *blockers)
    done = await wait_phase(client, project, job_id, "Completed", timeout_s=60)
    assert done["status"]["node_ids"][0] in ("lab-1", "res-1")
