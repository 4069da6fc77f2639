"""Submission refuses a job whose code or inputs point at an address that is not public (the API's own port, the
cloud metadata service, a private network) with 406001 naming the field, in a create and in a dry run; the
operator's allowance admits a host explicitly. (A v1 body has no URL the agent fetches: data_url and train_url are
the task's arguments.)"""

import pytest

from shared.storage import StoragePolicy
from tests.factories import job_body
from tests.unit.addresses import NOT_PUBLIC, in_url
from tests.unit.test_search_api import app_and_client, body as search_body
from tests.unit.test_submission import PROJECT, api, client

ATTACKS = [
    ("inputs", "http://127.0.0.1:8000/healthz", "127.0.0.1 is a loopback address"),
    ("inputs", "http://169.254.169.254/latest/meta-data/iam/", "169.254.169.254 is a link-local address"),
    ("inputs", "http://localhost:8000/healthz", "localhost resolves to"),
    ("code_dir", "https://[0:0:0:0:0:ffff:a00:1]/code.tar", "private address"),
    ("inputs", "http://100.64.0.9/x", "CGNAT"),
]


async def egress_api():
    """The submission app with the default storage policy (not the working directory's cluster file)."""
    app = await api()
    app.state.submitter.storage = StoragePolicy(storage_root="s3://tm/storage", checkpoint_root="s3://tm/ckpt")
    return app


def body(where: str, url: str, *, name: str = "egress") -> dict:
    if where == "code_dir":
        return job_body(name=name, code_dir=url)
    return job_body(name=name, inputs=[{"name": "data", "url": url}])


@pytest.mark.parametrize("where, url, why", ATTACKS)
@pytest.mark.parametrize("dry_run", [False, True])
async def test_an_input_or_code_at_an_internal_address_is_refused(where, url, why, dry_run):
    app = await egress_api()
    async with client(app) as http:
        response = await http.post(
            f"/v2/{PROJECT}/training-jobs{'?dry_run=true' if dry_run else ''}", json=body(where, url)
        )
    assert response.status_code == 400, response.text
    field = "algorithm.code_dir" if where == "code_dir" else "algorithm.inputs.0.url"
    assert response.json()["error_code"] == "406001"
    assert response.json()["error_msg"].startswith(f"param[{field}] invalid: ") and why in response.json()["error_msg"]
    submitter = app.state.submitter
    assert submitter.requester.broker.asked == [] and await submitter.repo.jobs.count_documents({}) == 0


@pytest.mark.parametrize("address", NOT_PUBLIC)
async def test_every_address_form_is_refused_through_the_api(address):
    app = await egress_api()
    async with client(app) as http:
        response = await http.post(
            f"/v2/{PROJECT}/training-jobs?dry_run=true", json=body("inputs", f"http://{in_url(address)}:8000/x")
        )
    message = response.json()["error_msg"]
    assert response.status_code == 400 and message.startswith("param[algorithm.inputs.0.url] invalid: ")
    assert "address" in message and "chained" not in message  # an IPv6 literal's `::` is no chained URL


async def test_a_search_template_is_refused_the_same_way():
    app, db, _ = await app_and_client()
    template = search_body()["template"]
    template["algorithm"]["inputs"] = [{"name": "data", "url": "http://169.254.169.254/latest/"}]
    async with client(app) as http:
        response = await http.post(f"/v2/{PROJECT}/searches", json=search_body(template=template))
    assert response.status_code == 400, response.text
    assert response.json()["error_msg"].startswith("param[algorithm.inputs.0.url] invalid: 169.254.169.254 is a ")
    assert db.api_searches.docs == {}


async def test_an_output_to_an_http_url_is_refused():
    app = await egress_api()
    async with client(app) as http:
        response = await http.post(
            f"/v2/{PROJECT}/training-jobs",
            json=job_body(name="out", outputs=[{"name": "model", "url": "https://93.184.216.34/upload"}]),
        )
    assert response.status_code == 400
    assert response.json()["error_msg"].startswith("param[algorithm.outputs.0.url] invalid: outputs cannot be http")


async def test_public_and_operator_allowed_addresses_are_taken():
    app = await egress_api()
    app.state.submitter.storage = app.state.submitter.storage.model_copy(update={"allow_hosts": ("127.0.0.1",)})
    async with client(app) as http:
        for i, url in enumerate(("https://93.184.216.34/data.tar", "http://127.0.0.1:8000/data.tar")):
            response = await http.post(f"/v2/{PROJECT}/training-jobs", json=body("inputs", url, name=f"ok{i}"))
            assert response.status_code == 201, response.text
        refused = await http.post(f"/v2/{PROJECT}/training-jobs", json=body("inputs", "http://127.0.0.2:8000/x"))
    assert refused.status_code == 400


async def test_no_bucket_but_the_projects_own_is_taken_by_default():
    app = await egress_api()
    async with client(app) as http:
        for url in ("s3://other-project/data", "s3://tm/storage/nlp/data"):
            response = await http.post(f"/v2/{PROJECT}/training-jobs", json=body("inputs", url))
            assert response.status_code == 400, url
            assert response.json()["error_msg"].startswith("param[algorithm.inputs.0.url] invalid: not in this project")
        own = await http.post(f"/v2/{PROJECT}/training-jobs", json=body("inputs", f"s3://tm/storage/{PROJECT}/d"))
    assert own.status_code == 201, own.text
