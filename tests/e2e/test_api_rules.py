"""Authentication, project isolation and input validation through the REST API."""

import httpx
import pytest

from tests.e2e.helpers import submit
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e


async def test_no_token_is_401_and_healthz_is_open(stack):
    async with httpx.AsyncClient(base_url=stack.api_url) as anonymous:
        response = await anonymous.get("/v2/p/training-jobs")
        assert response.status_code == 401 and response.json()["error_code"] == "406039"
        bad = await anonymous.get("/v2/p/training-jobs", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401
        health = await anonymous.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"


async def test_users_see_only_their_projects(stack, api):
    alice = (await api.post("/v2/users", json={"user_name": unique("alice"), "projects": ["team-a"]})).json()
    bob = (await api.post("/v2/users", json={"user_name": unique("bob"), "projects": ["team-b"]})).json()
    async with (
        httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {alice['token']}"}) as as_alice,
        httpx.AsyncClient(base_url=stack.api_url, headers={"Authorization": f"Bearer {bob['token']}"}) as as_bob,
    ):
        job = await submit(as_alice, "team-a", command="true")
        assert job["metadata"]["user_name"] == alice["user_name"]
        job_id = job["metadata"]["id"]
        hidden = await as_bob.get(f"/v2/team-a/training-jobs/{job_id}")
        assert hidden.status_code == 404 and hidden.json()["error_code"] == "406012"
        assert (await as_bob.get(f"/v2/team-b/training-jobs/{job_id}")).status_code == 404
        forbidden = await as_bob.get("/v2/team-a/training-jobs")
        assert forbidden.status_code == 403 and forbidden.json()["error_code"] == "406037"
        assert (await as_bob.post("/v2/users", json={"user_name": "x"})).status_code == 403
        assert (await api.get(f"/v2/team-a/training-jobs/{job_id}")).status_code == 200  # the admin sees all


@pytest.mark.parametrize(
    "mutate,field,code",
    [
        (lambda b: b["metadata"].update(name="x" * 65), "metadata.name", "406016"),
        (lambda b: b["metadata"].update(name=""), "metadata.name", "406015"),
        (lambda b: b["metadata"].update(description="d" * 257), "metadata.description", "406018"),
        (lambda b: b["algorithm"].pop("command"), "algorithm", "406001"),  # command or boot_file is required
        (lambda b: b["spec"]["resource"].update(gpu_count=-1), "spec.resource.gpu_count", "406001"),
        (lambda b: b["spec"]["placement"].update(allowed="mars"), "spec.placement.allowed", "406001"),
        (lambda b: b["spec"].update(surprise=1), "spec.surprise", "406001"),
        (lambda b: b["algorithm"].update(metrics=[{"name": "l", "regex": "("}]), "algorithm.metrics.0.regex", "406001"),
    ],
)
async def test_bad_bodies_are_400_naming_the_field_and_create_nothing(api, project, mutate, field, code):
    body = job_body()
    mutate(body)
    response = await api.post(f"/v2/{project}/training-jobs", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == code and f"param[{field}]" in response.json()["error_msg"]
    assert (await api.get(f"/v2/{project}/training-jobs")).json()["total"] == 0


async def test_malformed_json_and_duplicate_names(api, project):
    response = await api.post(
        f"/v2/{project}/training-jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error_code"] == "406001"
    job = await submit(api, project, command="sleep 5")
    duplicate = await api.post(f"/v2/{project}/training-jobs", json=job_body(name=job["metadata"]["name"]))
    assert duplicate.status_code == 409 and duplicate.json()["error_code"] == "406026"
    assert (await api.get(f"/v2/{project}/training-jobs")).json()["total"] == 1


async def test_unknown_job_and_bad_action(api, project):
    missing = await api.get(f"/v2/{project}/training-jobs/nope")
    assert missing.status_code == 404 and missing.json()["error_code"] == "406012"
    job = await submit(api, project, command="true")
    bad = await api.post(
        f"/v2/{project}/training-jobs/{job['metadata']['id']}/actions", json={"action_type": "explode"}
    )
    assert bad.status_code == 400 and "param[action_type]" in bad.json()["error_msg"]


async def test_nodes_are_listed_with_their_resources(api, stack):
    nodes = (await api.get("/v2/nodes")).json()["items"]
    assert {n["node_id"] for n in nodes} == set(stack.node_ids())
    local = next(n for n in nodes if n["kind"] == "local")
    assert local["gpus"][0]["memory_gb"] == 24 and local["resources_source"] == "config" and local["virtual"]
