"""The API's edge without a stack: body size, parse errors and strict types answer in the documented shape."""

import httpx
import pytest
from fastapi import FastAPI
from pymongo.errors import ServerSelectionTimeoutError

from shared.jobs import JobCreate
from services.submitter import errors
from services.submitter.limits import BodyLimit
from tests.factories import job_body
from tests.unit import api_app

MAX = 4096


def edge_app() -> FastAPI:
    app = FastAPI()
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=MAX)

    @app.post("/jobs")
    async def create(body: JobCreate) -> dict:
        return {"name": body.metadata.name}

    return app


@pytest.fixture
async def client():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=edge_app()), base_url="http://edge") as client:
        yield client


def shaped(response: httpx.Response, status: int, code: str, field: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error_code", "error_msg"} and body["error_code"] == code
    assert f"param[{field}]" in body["error_msg"], body


async def test_a_body_announced_too_large_is_413(client):
    response = await client.post("/jobs", content=b"x" * (MAX + 1), headers={"content-type": "application/json"})
    shaped(response, 413, "406038", "body")


async def test_a_streamed_body_without_a_length_is_counted_and_capped(client):
    async def chunks():
        for _ in range(10):
            yield b" " * 1000

    response = await client.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    shaped(response, 413, "406038", "body")


async def test_a_streamed_body_within_the_limit_goes_through(client):
    payload = httpx.Request("POST", "/", json=job_body(name="streamed")).content

    async def chunks():
        for i in range(0, len(payload), 10):
            yield payload[i : i + 10]

    response = await client.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json() == {"name": "streamed"}


async def test_a_bad_content_length_is_400(client):
    response = await client.post(
        "/jobs", content=b"{}", headers={"content-type": "application/json", "content-length": "-1"}
    )
    shaped(response, 400, "406001", "Content-Length")


@pytest.mark.parametrize("raw", [b"{not json", b"[" * 3000 + b"]" * 3000, b'{"a": "\xff"}'])
async def test_unparseable_bodies_answer_in_the_error_shape(raw):
    app = edge_app()
    app.user_middleware.clear()  # the deep one is under 4 KB only compressed: let it through uncapped
    app.add_middleware(BodyLimit, max_bytes=1 << 20)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edge") as client:
        response = await client.post("/jobs", content=raw, headers={"content-type": "application/json"})
    shaped(response, 400, "406001", "body")


async def test_unknown_routes_and_methods_answer_in_the_error_shape(client):
    missing = await client.get("/nowhere")
    assert missing.status_code == 404 and missing.json()["error_code"] == "406040"
    wrong = await client.delete("/jobs")
    assert wrong.status_code == 405 and set(wrong.json()) == {"error_code", "error_msg"}


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["spec"]["resource"].update(gpu_count=True), "spec.resource.gpu_count"),
        (lambda b: b["spec"]["resource"].update(node_count="1"), "spec.resource.node_count"),
        (lambda b: b["spec"]["resource"].update(cpu_count=False), "spec.resource.cpu_count"),
        (lambda b: b["spec"]["resource"].update(memory_gb="8"), "spec.resource.memory_gb"),
        (lambda b: b["spec"].update(max_duration_s=True), "spec.max_duration_s"),
        (lambda b: b["spec"]["placement"].update(expected_duration_s="60"), "spec.placement.expected_duration_s"),
        (lambda b: b["algorithm"].update(command="echo a\u0000b"), "algorithm.command"),
        (lambda b: b["algorithm"].update(environments={"DATASET": "x\u0000"}), "algorithm.environments"),
        (
            lambda b: b["algorithm"].update(parameters=[{"name": "lr", "value": "0.1\u0000"}]),
            "algorithm.parameters.0.value",
        ),
        (lambda b: b["metadata"].update(description="d\u0000"), "metadata.description"),
        (
            lambda b: b["algorithm"].update(metrics=[{"name": "loss", "regex": "loss (?P<value>.+)", "target": True}]),
            "algorithm.metrics.0.target",
        ),
    ],
)
async def test_strict_types_and_null_bytes_are_refused_naming_the_field(client, mutate, field):
    body = job_body()
    mutate(body)
    shaped(await client.post("/jobs", json=body), 400, "406001", field)


async def test_nan_and_infinity_are_refused(client):
    raw = job_body()
    raw["algorithm"]["metrics"] = [{"name": "loss", "regex": "loss (?P<value>.+)", "target": 0.5}]
    text = httpx.Request("POST", "/", json=raw).content.replace(b"0.5", b"NaN")
    response = await client.post("/jobs", content=text, headers={"content-type": "application/json"})
    shaped(response, 400, "406001", "algorithm.metrics.0.target")


async def test_json_numbers_of_the_right_kind_are_taken(client):
    body = job_body(gpu_count=1, cpu_count=2, memory_gb=1.5, node_count=1)
    assert (await client.post("/jobs", json=body)).status_code == 200


async def test_a_database_that_does_not_answer_is_a_503_in_the_documented_shape():
    app, _, _ = await api_app.make_app()

    async def page(*args, **kwargs):
        raise ServerSelectionTimeoutError("mongo.sock: timed out")

    app.state.submitter.repo.page = page
    async with api_app.client(app) as api:
        answer = await api.get("/v2/p/training-jobs")
    assert answer.status_code == 503 and answer.headers["retry-after"] == "2"
    assert answer.json() == {
        "error_code": "406003",
        "error_msg": "the job store is unavailable right now; retry shortly",
    }
