"""Limits at the edge, through the real server: body size, a burst from one token, queued-job caps, paged and
capped output, and jobs no node could ever hold. A fleet of its own: one 1-GPU node (kept busy, so GPU jobs
queue) and one CPU node."""

import asyncio
import sys

import httpx
import pytest
import pytest_asyncio

from tests.conftest import admin_client, eventually, start_stack, stop_later, stops_done
from tests.e2e.helpers import submit, wait_phase
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e

FLEET = """
[[nodes]]
id = "edge-gpu"
kind = "local"
cpu_count = 8
memory_gb = 32
price_per_hour = 0.5
gpus = [{ model = "L4", memory_gb = 24, tflops = 125, count = 1 }]

[[nodes]]
id = "edge-cpu"
kind = "local"
cpu_count = 8
memory_gb = 32
price_per_hour = 0.2
"""
USER_CAP, PROJECT_CAP, LOG_CAP = 150, 180, 100_000
# a slower token bucket than the default (20/s, bursts of 100), so that it speaks on a loaded 2-core test machine
LIMITS = {
    "TRAINMASTER_RATE_PER_S": "5",
    "TRAINMASTER_RATE_BURST": "50",
    "TRAINMASTER_MAX_QUEUED_PER_USER": str(USER_CAP),
    "TRAINMASTER_MAX_QUEUED_PER_PROJECT": str(PROJECT_CAP),
    "TRAINMASTER_LOG_CAP_BYTES": str(LOG_CAP),
}
PROJECT = "edge"
OTHER = "edge-other"  # for the tests after the caps test, which leaves PROJECT's queue full


@pytest.fixture(scope="module")
def edge(tmp_path_factory, servers):
    stops_done()  # the burst below loads the API: no earlier module's stack stopping beside it
    stack = start_stack(tmp_path_factory.mktemp("edge"), cluster=FLEET, servers=servers, extra_env=LIMITS)
    yield stack
    stop_later(stack)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def admin(edge):
    async with admin_client(edge, timeout=60) as api:
        # GPU jobs after it queue (an hour: the module takes minutes on a loaded machine; the stack's stop ends it)
        blocker = await submit(api, PROJECT, command="sleep 3600", gpu_count=1)
        await wait_phase(api, PROJECT, blocker["metadata"]["id"], "Running")
        yield api


async def member(edge, admin) -> httpx.AsyncClient:
    user = (await admin.post("/v2/users", json={"user_name": unique("u"), "projects": [PROJECT]})).json()
    limits = httpx.Limits(max_connections=50)
    return httpx.AsyncClient(
        base_url=edge.api_url, timeout=120, limits=limits, headers={"Authorization": f"Bearer {user['token']}"}
    )


def error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert set(response.json()) == {"error_code", "error_msg"} and response.json()["error_code"] == code
    return response.json()["error_msg"]


async def test_a_20_mb_body_is_413_announced_or_streamed(edge, admin):
    path = f"/v2/{PROJECT}/training-jobs"
    big = await admin.post(path, content=b" " * (20 * 1024 * 1024), headers={"content-type": "application/json"})
    assert "param[body]" in error(big, 413, "406038")

    async def stream():
        for _ in range(2 * 1024):
            yield b" " * 1024

    chunked = await admin.post(path, content=stream(), headers={"content-type": "application/json"})
    assert "param[body]" in error(chunked, 413, "406038")
    assert (await admin.get(f"/v2/{PROJECT}/training-jobs", params={"limit": 1})).status_code == 200


@pytest.mark.timeout(600)  # 1,000 requests and every accepted job seen by the monitor: minutes on a loaded machine
async def test_a_burst_of_1000_gets_429s_and_loses_none_of_the_accepted(edge, admin):
    async with await member(edge, admin) as client:
        in_flight = asyncio.Semaphore(40)  # as many at once as the client's pool holds (it slows down past it)

        async def one(i: int) -> httpx.Response:
            async with in_flight:
                return await client.post(
                    f"/v2/{PROJECT}/training-jobs", json=job_body(name=f"burst-{i}", command="true", gpu_count=1)
                )

        answers = await asyncio.gather(*(one(i) for i in range(1000)))
        statuses = [a.status_code for a in answers]
        assert set(statuses) <= {201, 429, 503}, {s for s in statuses if s not in (201, 429, 503)}
        # 503: billing or placement did not answer in time (a loaded 2-core machine); said so, and nothing stored
        assert all(a.json()["error_code"] == "406003" for a in answers if a.status_code == 503)
        limited = [a for a in answers if a.status_code == 429]
        assert limited and all(int(a.headers["retry-after"]) >= 1 for a in limited)
        assert {a.json()["error_code"] for a in limited} <= {"406042", "406035"}
        assert any(a.json()["error_code"] == "406042" for a in limited)  # the token bucket spoke
        accepted = {a.json()["metadata"]["id"] for a in answers if a.status_code == 201}
        assert len(accepted) >= 50  # at least the burst

        async def all_announced():
            listed = (await admin.get(f"/v2/{PROJECT}/training-jobs", params={"limit": 500})).json()
            mine = [j for j in listed["items"] if j["metadata"]["name"].startswith("burst-")]
            return mine if all(j["status"]["phase"] != "Creating" for j in mine) else None

        mine = await eventually(all_announced, timeout_s=120, interval_s=1)  # the monitor saw every one
        assert {j["metadata"]["id"] for j in mine} == accepted  # each 201 stored, nothing stored without its 201
        waiting = [j for j in mine if j["status"]["phase"] == "Pending"]
        # never more than the cap waiting; a job that ran (its node lost and back on a loaded machine) made room
        assert len(waiting) <= USER_CAP and len(accepted) <= USER_CAP + len(mine) - len(waiting)


async def queued_in(admin) -> int:
    return (
        await admin.get(f"/v2/{PROJECT}/training-jobs", params={"phase": ["Creating", "Pending"], "limit": 1})
    ).json()["total"]


async def create_until_refused(client, prefix: str, *, most: int | None = None) -> tuple[int, httpx.Response | None]:
    """Jobs queued behind the blocker, one at a time (waiting out the token bucket), until one is refused or `most`
    are made; how many were made and the refusal."""
    created = 0
    while most is None or created < most:
        answer = await client.post(
            f"/v2/{PROJECT}/training-jobs", json=job_body(name=f"{prefix}-{created}", command="true", gpu_count=1)
        )
        if answer.status_code == 429 and answer.json()["error_code"] == "406042":  # too fast: wait, again
            await asyncio.sleep(int(answer.headers["retry-after"]))
            continue
        if answer.status_code != 201:
            return created, answer
        created += 1
    return created, None


async def test_queued_jobs_are_capped_per_user_and_per_project(edge, admin):
    # The project's cap must come before this user's: another member's jobs fill the project's queue past
    # PROJECT_CAP - USER_CAP, whatever the burst before left queued.
    short = PROJECT_CAP - USER_CAP + 10 - await queued_in(admin)
    if short > 0:
        async with await member(edge, admin) as other:
            made, refused = await create_until_refused(other, "fill", most=short)
            assert made == short, refused and refused.text
    async with await member(edge, admin) as client:
        queued = await queued_in(admin)
        created, answer = await create_until_refused(client, "cap")
        assert answer is not None
        assert created == PROJECT_CAP - queued < USER_CAP
        assert "queued job quantity of project edge has reached the upper limit" in error(answer, 429, "406035")


async def test_output_is_paged_and_capped_with_the_drop_said(edge, admin):
    script = "for i in range(3000): print(f'line {i:05d} ' + 'x' * 88, flush=True)"  # 100 bytes a line: 300 KB
    job = await submit(admin, OTHER, command=f'{sys.executable} -c "{script}"', allowed="local")
    job_id = job["metadata"]["id"]
    await wait_phase(admin, OTHER, job_id, "Completed", timeout_s=90)
    path = f"/v2/{OTHER}/training-jobs/{job_id}/logs"

    async def complete():
        page = await admin.get(path, params={"offset": 2999, "limit": 1})
        return page if page.text.startswith("line 02999") else None

    await eventually(complete, timeout_s=30)
    lines, offset, pages = [], 0, 0
    while True:
        page = await admin.get(path, params={"offset": offset, "limit": 400})
        assert page.status_code == 200 and int(page.headers["x-log-offset"]) >= offset
        lines += page.text.splitlines()
        offset, pages = int(page.headers["x-log-next-offset"]), pages + 1
        if page.headers["x-log-more"] == "false":
            break
    dropped = int(page.headers["x-log-dropped"])
    assert 0 < dropped < 3000 and offset == 3000 and pages > 1
    assert lines[0] == f"… {dropped} earlier lines dropped (the job's stored output is capped; the oldest goes first) …"
    assert lines[1:] == [f"line {i:05d} " + "x" * 88 for i in range(dropped, 3000)]
    assert (3000 - dropped) * 100 <= LOG_CAP
    followed = await admin.get(path, params={"follow": "true"})
    assert followed.text.startswith(f"… {dropped} earlier lines dropped") and "line 02999" in followed.text
    bad = await admin.get(path, params={"limit": 0})
    assert "param[limit]" in error(bad, 400, "406001")


async def test_a_job_no_node_could_ever_hold_is_refused_in_every_dialect(edge, admin):
    path = f"/v2/{OTHER}/training-jobs"
    huge = job_body(node_count=64, cpu_count=1000)
    for params in ({}, {"dry_run": "true"}):
        msg = error(await admin.post(path, params=params, json=huge), 400, "406001")
        assert (
            msg.startswith("param[spec.resource.node_count] invalid: no node of the fleet")
            and "param[spec.resource.cpu_count]" in msg
        )
    memory = job_body(gpu_count=16, min_gpu_memory_gb=128)  # 2 TB of GPU memory per node
    assert error(await admin.post(path, json=memory), 400, "406001").startswith("param[spec.resource.gpu_count]")
    v1 = {"job_name": unique("v1"), "config": {"worker_server_num": 64, "user_command": "true"}}
    answer = await admin.post(f"/v1/{OTHER}/training-jobs", json=v1)
    assert answer.status_code == 400 and answer.json()["is_success"] is False
    assert answer.json()["error_msg"].startswith("param[config.worker_server_num] invalid: no node")
    names = {j["metadata"]["name"] for j in (await admin.get(path, params={"limit": 500})).json()["items"]}
    assert huge["metadata"]["name"] not in names and v1["job_name"] not in names
