"""Costs through the REST API against the real stack: charges, owned vs rented spend, budgets, alerts, csv."""

import asyncio
import csv
import io
from datetime import timedelta

import httpx
import nats
import pytest

from shared.clock import utcnow
from shared.events import NodeProvisioned, NodeReleased
from tests.conftest import eventually
from tests.e2e.helpers import submit, wait_phase
from tests.factories import job_body, unique

HEARTBEAT_S = 0.5  # the stack fixture's heartbeat interval


async def user_client(stack, api: httpx.AsyncClient, project: str, name: str) -> httpx.AsyncClient:
    created = await api.post("/v2/users", json={"user_name": name, "projects": [project]})
    assert created.status_code == 201, created.text
    return httpx.AsyncClient(
        base_url=stack.api_url, timeout=30, headers={"Authorization": f"Bearer {created.json()['token']}"}
    )


async def prices(api: httpx.AsyncClient) -> dict[str, float]:
    return {n["node_id"]: n["price_per_hour"] for n in (await api.get("/v2/nodes")).json()["items"]}


async def usage(api: httpx.AsyncClient, project: str, **params) -> dict:
    response = await api.get(f"/v2/{project}/usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_job_is_charged_its_run_time_times_its_share_of_its_node_price(api, project):
    job = await submit(api, project, command="sleep 2", allowed="local", gpu_count=1)
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed")
    [attempt] = done["status"]["attempts"]
    ran_s = (attempt["end_time"] - attempt["start_time"]) / 1000
    node = next(n for n in (await api.get("/v2/nodes")).json()["items"] if n["node_id"] == attempt["node_ids"][0])
    price = node["price_per_hour"] / len(node["gpus"])  # its 1 GPU's share: jobs beside it pay for theirs

    async def charged():
        report = await usage(api, project)
        return report if report["total"]["attempts"] == 1 and report["open_attempts"] == 0 else None

    total = (await eventually(charged))["total"]
    assert abs(total["seconds"] - ran_s) <= HEARTBEAT_S
    assert total["cost"] == pytest.approx(total["seconds"] * price / 3600)
    assert total["owned_cost"] == pytest.approx(total["cost"]) and total["on_demand_cost"] == 0


async def test_the_usage_report_splits_owned_and_rented_spend_per_user(stack, api, project):
    ana, bob = unique("ana"), unique("bob")
    async with (
        await user_client(stack, api, project, ana) as as_ana,
        await user_client(stack, api, project, bob) as as_bob,
    ):
        owned = await submit(as_ana, project, command="sleep 1", allowed="local", gpu_count=1)
        rented = await submit(as_bob, project, command="sleep 1", gpu_count=1, min_gpu_memory_gb=60, allowed="cloud")
        for job in (owned, rented):
            await wait_phase(api, project, job["metadata"]["id"], "Completed", timeout_s=120)

        async def split():
            report = await usage(as_ana, project, group_by="user")
            rows = {r["key"]: r for r in report["groups"]}
            return rows if report["open_attempts"] == 0 and {ana, bob} <= set(rows) else None

        rows = await eventually(split)
        assert rows[ana]["owned_cost"] > 0 and rows[ana]["on_demand_cost"] == 0 and rows[ana]["local_gpu_hours"] > 0
        assert rows[bob]["owned_cost"] == 0 and rows[bob]["on_demand_cost"] > 0 and rows[bob]["on_demand_nodes"] == 1
        assert rows[bob]["on_demand_seconds"] > 0
        report = await usage(as_ana, project, group_by="user")
        assert report["on_demand"]["nodes"] >= 1 and report["owned"]["local"]["available_gpu_hours"] > 0
        assert 0 < report["owned"]["local"]["utilisation"] <= 1
        assert (await as_ana.get(f"/v2/{project}/usage", params={"group_by": "project"})).status_code == 403
    everyone = await usage(api, project, group_by="project")
    assert project in {r["key"] for r in everyone["groups"]}


async def test_a_budget_stops_a_submission_with_406029_and_creates_nothing(stack, api, project):
    member = unique("carol")
    async with await user_client(stack, api, project, member) as as_member:
        refused = await as_member.put(f"/v2/{project}/quotas", json={"budget_per_month": 1})
        assert (refused.status_code, refused.json()["error_code"]) == (403, "406037")
        set_ = await api.put(f"/v2/{project}/quotas", json={"budget_per_month": 0.01, "max_gpus": 2})
        assert set_.status_code == 200 and set_.json()["quotas"]["budget_per_month"] == 0.01
        response = await as_member.post(
            f"/v2/{project}/training-jobs", json=job_body(allowed="local", expected_duration_s=3600)
        )
        assert response.status_code == 403, response.text
        assert response.json()["error_code"] == "406029"
        assert "budget_per_month] quota exceeded" in response.json()["error_msg"]
        too_wide = await as_member.post(
            f"/v2/{project}/training-jobs", json=job_body(gpu_count=1, node_count=3, expected_duration_s=1)
        )
        assert too_wide.json()["error_code"] == "406008"
        assert (await as_member.get(f"/v2/{project}/training-jobs")).json()["total"] == 0
        read = await as_member.get(f"/v2/{project}/quotas")
        assert read.status_code == 200 and read.json()["quotas"]["max_gpus"] == 2
        per_user = await api.put(f"/v2/{project}/quotas/users/{member}", json={"budget_per_month": 5})
        assert per_user.json()["quotas"]["users"][member]["budget_per_month"] == 5
        await api.put(f"/v2/{project}/quotas", json={})  # limits lifted: the same job is taken
        await submit(as_member, project, allowed="local", expected_duration_s=3600)


async def test_the_80_percent_budget_alert_is_delivered_once(api, project):
    # RTX-3090 only on local-2 at $0.40/h: 16 s is $0.00178, 81% of $0.0022; 100% is 19.8 s, so the attempt's start
    # and end may take 3.8 s beyond its sleep (2 s was once too little on a loaded 2-core machine: both alerts went)
    await api.put(f"/v2/{project}/quotas", json={"budget_per_month": 0.0022})
    body = job_body(command="sleep 16", gpu_count=1, expected_duration_s=1)
    body["spec"]["placement"]["gpu_models"] = ["RTX-3090"]
    response = await api.post(f"/v2/{project}/training-jobs", json=body)
    assert response.status_code == 201, response.text
    job = response.json()
    await wait_phase(api, project, job["metadata"]["id"], "Completed", timeout_s=90)

    async def alerted():
        items = (await api.get(f"/v2/{project}/notifications")).json()["items"]
        return [i for i in items if i["kind"] == "budget"] or None

    alerts = await eventually(alerted)
    await asyncio.sleep(3)  # several budget checks later (one a second in the test stack): still one
    items = (await api.get(f"/v2/{project}/notifications")).json()["items"]
    budget = [i for i in items if i["kind"] == "budget"]
    assert len(budget) == 1 and "80%" in budget[0]["message"], budget
    assert alerts[0]["id"] == budget[0]["id"]


async def test_usage_as_csv(api, project):
    job = await submit(api, project, command="true", allowed="local")
    await wait_phase(api, project, job["metadata"]["id"], "Completed")

    async def charged():
        return (await usage(api, project))["total"]["attempts"] == 1

    await eventually(charged)
    response = await api.get(f"/v2/{project}/usage", params={"format": "csv", "group_by": "node_kind"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert rows[-1]["node_kind"] == "(total)" and rows[-1]["attempts"] == "1"
    assert rows[0]["node_kind"] == "local" and float(rows[0]["owned_cost"]) >= 0


async def test_a_rented_node_is_charged_its_lifetime_times_its_price_once(stack, api, project):
    node_id, now = unique("od"), utcnow()
    provisioned = NodeProvisioned(
        event_id=f"{node_id}:provisioned",
        node_id=node_id,
        instance_type="a2",
        provider="test",
        price_per_hour=3.6,
        gpu_count=1,
        provisioned_at=now - timedelta(hours=2),
        project_id=project,
        user_name="ana",
    )
    released = NodeReleased(event_id=f"{node_id}:released", node_id=node_id, released_at=now - timedelta(minutes=30))
    client = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    try:
        js = client.jetstream()
        for event in (
            provisioned,
            released,
            released.model_copy(update={"event_id": "again"}),
            provisioned.model_copy(update={"event_id": "late"}),
        ):  # new ids: past the stream's de-dup
            await js.publish(event.subject, event.model_dump_json().encode(), headers={"Nats-Msg-Id": event.event_id})
    finally:
        await client.close()

    async def charged():
        rows = {r["key"]: r for r in (await usage(api, project, group_by="node"))["groups"]}
        return rows.get(node_id)

    row = await eventually(charged)
    await asyncio.sleep(1)  # the late duplicates have been seen too
    row = {r["key"]: r for r in (await usage(api, project, group_by="node"))["groups"]}[node_id]
    assert row["on_demand_cost"] == pytest.approx(1.5 * 3.6) and row["on_demand_seconds"] == pytest.approx(5400)
    ana = {r["key"]: r for r in (await usage(api, project))["by_user"]}["ana"]
    assert ana["on_demand_nodes"] == 1 and ana["on_demand_cost"] == pytest.approx(5.4)
