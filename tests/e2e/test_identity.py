"""Identity through the whole stack: webhook targets, token expiry and revocation, the audit log, the fleet view."""

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import eventually
from tests.e2e.helpers import submit, wait_phase
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def as_user(stack, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/hook",
        "http://localhost:8080/hook",
        "http://[::1]:8080/hook",
        "http://0.0.0.0/",
    ],
)
async def test_webhooks_to_internal_addresses_are_refused(api, project, url):
    response = await api.put(f"/v2/{project}/notifications", json={"webhook_url": url})
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "406001" and "param[webhook_url]" in response.json()["error_msg"]
    assert (await api.get(f"/v2/{project}/notifications")).json()["webhook_url"] is None


async def test_jobs_fetching_internal_addresses_are_refused(stack, api, project):
    """The API's own port and the metadata service as a job's input or code: refused, dry run included."""
    attacks = {
        "algorithm.inputs.0.url": {"inputs": [{"name": "data", "url": f"{stack.api_url}/healthz"}]},
        "algorithm.code_dir": {"code_dir": "http://169.254.169.254/latest/meta-data/"},
    }
    for field, fields in attacks.items():
        for query in ("", "?dry_run=true"):
            response = await api.post(f"/v2/{project}/training-jobs{query}", json=job_body(**fields))
            assert response.status_code == 400, response.text
            message = response.json()["error_msg"]
            assert response.json()["error_code"] == "406001"
            assert message.startswith(f"param[{field}] invalid: ") and "address" in message, message
    assert (await api.get(f"/v2/{project}/training-jobs")).json()["total"] == 0


async def test_tokens_expire_list_and_revoke(stack, api):
    name = unique("tess")
    created = await api.post("/v2/users", json={"user_name": name, "projects": ["team-t"], "expires_in": 3600})
    assert created.status_code == 201, created.text
    user = created.json()
    async with as_user(stack, user["token"]) as tess:
        short = (await tess.post(f"/v2/users/{name}/tokens", json={"expires_in": 1})).json()
        spare = (await tess.post(f"/v2/users/{name}/tokens")).json()
        listed = (await tess.get(f"/v2/users/{name}/tokens")).json()
        assert {t["token_id"] for t in listed["items"]} == {user["token_id"], short["token_id"], spare["token_id"]}
        assert all(t["last_used"] for t in listed["items"] if t["token_id"] == user["token_id"])
        assert user["token"] not in str(listed) and spare["token"] not in str(listed)
        assert (await tess.delete(f"/v2/users/{name}/tokens/{spare['token_id']}")).status_code == 204

    async with as_user(stack, spare["token"]) as revoked:
        refused = await revoked.get("/v2/me")
        assert (refused.status_code, refused.json()["error_code"]) == (401, "406039")

    async def expired():
        async with as_user(stack, short["token"]) as client:
            answer = await client.get("/v2/me")
            return answer if answer.status_code == 401 else None

    answer = await eventually(expired, timeout_s=15, interval_s=0.3)
    assert answer.json()["error_code"] == "406039" and "expired" in answer.json()["error_msg"]


async def test_every_change_to_a_job_is_in_the_audit_log(stack, api):
    name, project = unique("aud"), unique("audp")
    user = (await api.post("/v2/users", json={"user_name": name, "projects": [project]})).json()
    async with as_user(stack, user["token"]) as client:
        job = await submit(client, project, command="sleep 30")
        job_id = job["metadata"]["id"]
        await wait_phase(client, project, job_id, "Running", "Pending")
        assert (
            await client.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
        ).status_code == 202
        await wait_phase(client, project, job_id, "Terminated", "Failed", "Completed")
        assert (await client.delete(f"/v2/{project}/training-jobs/{job_id}")).status_code == 204
        assert (await client.get("/v2/audit")).status_code == 403
    log = (await api.get("/v2/audit", params={"user": name, "project": project})).json()
    mine = [(e["action"], e["target_id"], e["status"]) for e in reversed(log["items"])]
    assert mine == [("job.create", job_id, 201), ("job.terminate", job_id, 202), ("job.delete", job_id, 204)]
    assert all(e["token_id"] == user["token_id"] and e["client_ip"] == "127.0.0.1" for e in log["items"])
    created = (await api.get("/v2/audit", params={"user": "admin"})).json()["items"]
    assert any(e["action"] == "user.create" and e["target_id"] == name for e in created)


async def test_the_fleet_view_hides_other_projects_jobs_from_members(stack, api):
    theirs, mine = unique("secret"), unique("mine")
    user = (await api.post("/v2/users", json={"user_name": unique("nina"), "projects": [mine]})).json()
    job = await submit(api, theirs, command="sleep 60", allowed="local")
    job_id = job["metadata"]["id"]
    try:
        await wait_phase(api, theirs, job_id, "Running")

        async def on_a_node():  # nodes report their tasks with their heartbeat
            items = (await api.get("/v2/nodes")).json()["items"]
            return [t for n in items for t in n["running"] if t["job_id"] == job_id]

        assert (await eventually(on_a_node, timeout_s=15))[0]["project_id"] == theirs
        async with as_user(stack, user["token"]) as nina:
            view = (await nina.get("/v2/nodes")).json()["items"]
        assert job_id not in str(view)
        assert sum(n["other_tasks"] for n in view) >= 1
    finally:
        await api.post(f"/v2/{theirs}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})


def test_a_short_admin_token_stops_the_submitter_at_start(tmp_path):
    env = {
        **os.environ,
        "TRAINMASTER_ADMIN_TOKEN": "only-sixteen-chr",
        "TRAINMASTER_DATA_DIR": str(tmp_path),
        "TRAINMASTER_API_PORT": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "services.submitter"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "TRAINMASTER_ADMIN_TOKEN must be at least 32 characters" in done.stderr
