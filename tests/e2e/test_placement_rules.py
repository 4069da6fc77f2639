"""The design's placement rules, each shown through the REST API on a fleet of its own with an on-demand
catalogue: one local node, one reserved node, and rentable instances that boot in a second."""

import asyncio

import pytest

from tests.e2e.helpers import get, submit, wait_phase
from tests.factories import job_body

pytestmark = pytest.mark.e2e


async def rented(api) -> list[dict]:
    return [n for n in (await api.get("/v2/nodes")).json()["items"] if n["node_id"].startswith("od-")]


async def terminate(api, project, *jobs) -> None:
    for job in jobs:
        await api.post(
            f"/v2/{project}/training-jobs/{job['metadata']['id']}/actions", json={"action_type": "terminate"}
        )
    for job in jobs:
        await wait_phase(api, project, job["metadata"]["id"], "Terminated", "Completed", "Failed")


async def occupy(api, project, allowed: str, *, expected_s: int = 3600) -> dict:
    """A long job holding the one GPU of a node of that kind."""
    job = await submit(api, project, command="sleep 600", gpu_count=1, allowed=allowed, expected_duration_s=expected_s)
    await wait_phase(api, project, job["metadata"]["id"], "Running")
    return job


async def stays_pending(api, project, job_id: str, seconds: float = 3) -> dict:
    await wait_phase(api, project, job_id, "Pending")
    for _ in range(int(seconds / 0.5)):
        job = await get(api, project, job_id)
        assert job["status"]["phase"] == "Pending" and not job["status"]["attempts"], job["status"]
        await asyncio.sleep(0.5)
    return job


async def test_a_local_only_job_waits_for_a_local_node_while_cloud_nodes_idle(client, project):
    blocker = await occupy(client, project, "local")
    waiter = await submit(client, project, command="true", gpu_count=1, allowed="local")
    await stays_pending(client, project, waiter["metadata"]["id"])
    assert await rented(client) == []
    await terminate(client, project, blocker)
    done = await wait_phase(client, project, waiter["metadata"]["id"], "Completed")
    assert done["status"]["node_ids"] == ["lab-1"]


async def test_a_cloud_only_job_takes_the_reserved_node_before_renting(client, project):
    job = await submit(client, project, command="sleep 1", gpu_count=1, allowed="cloud", expected_duration_s=600)
    done = await wait_phase(client, project, job["metadata"]["id"], "Completed")
    assert done["status"]["node_ids"] == ["res-1"] and await rented(client) == []


async def test_a_two_node_job_no_pair_of_local_nodes_could_hold_is_refused(client, project):
    # one local node: two ranks on local nodes can never start together, so the job is not taken at all
    body = job_body(command="true", gpu_count=1, node_count=2, allowed="local")
    for params in ({}, {"dry_run": "true"}):
        refused = await client.post(f"/v2/{project}/training-jobs", params=params, json=body)
        assert refused.status_code == 400 and refused.json()["error_code"] == "406001", refused.text
        assert refused.json()["error_msg"].startswith("param[spec.resource.node_count] invalid: no node")
    assert (await client.get(f"/v2/{project}/training-jobs")).json()["total"] == 0


async def test_a_cost_sensitive_job_waits_for_owned_capacity_when_that_is_cheaper(client, project):
    blockers = [
        await submit(client, project, command="sleep 4", gpu_count=1, allowed=kind, expected_duration_s=5)
        for kind in ("local", "cloud")
    ]
    for blocker in blockers:
        await wait_phase(client, project, blocker["metadata"]["id"], "Running")
    job = await submit(client, project, command="true", gpu_count=1, priority="cost", expected_duration_s=600)
    await stays_pending(client, project, job["metadata"]["id"], seconds=2)
    done = await wait_phase(client, project, job["metadata"]["id"], "Completed", timeout_s=60)
    assert done["status"]["node_ids"][0] in ("lab-1", "res-1") and await rented(client) == []


async def test_a_dry_run_estimates_each_allowed_kind_and_creates_nothing(client, project):
    body = {
        "metadata": {"name": "what-if"},
        "algorithm": {"command": "true"},
        "spec": {"resource": {"gpu_count": 1}, "placement": {"expected_duration_s": 7200}},
    }
    response = await client.post(f"/v2/{project}/training-jobs", params={"dry_run": "true"}, json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    kinds = {c["node_kind"]: c for c in answer["candidates"]}
    assert set(kinds) == {"local", "reserved", "on_demand"}
    rent = kinds["on_demand"]
    assert rent["instance_type"] == "g.small" and rent["price_per_hour"] == 2.0 and rent["startup_delay_s"] == 1
    assert kinds["local"]["node_id"] == "lab-1" and kinds["local"]["duration_source"] == "owner"
    assert {c["memory_gb"] for c in kinds.values()} == {32}  # no host memory asked: the one GPU's share, all of it
    for candidate in kinds.values():
        hours = candidate["predicted_duration_s"] / 3600
        assert candidate["expected_cost"] == pytest.approx(candidate["price_per_hour"] * hours, rel=1e-3)
    assert (await client.get(f"/v2/{project}/training-jobs")).json()["total"] == 0
    local_only = {**body, "spec": {"resource": {"gpu_count": 2}, "placement": {"allowed": "local"}}}
    none = await client.post(f"/v2/{project}/training-jobs", params={"dry_run": "true"}, json=local_only)
    assert none.status_code == 400 and "param[spec.resource.gpu_count]" in none.json()["error_msg"]
    assert "local: no local node can host 2 GPU(s)" in none.json()["error_msg"]
    bad = await client.post(
        f"/v2/{project}/training-jobs",
        params={"dry_run": "true"},
        json={**body, "spec": {"resource": {"gpu_count": -1}}},
    )
    assert bad.status_code == 400 and "param[spec.resource.gpu_count]" in bad.json()["error_msg"]
