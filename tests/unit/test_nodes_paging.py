"""`GET /v2/nodes` a page at a time: bounds named in the error, `total` and `next_offset` from the monitor."""

from shared.bus import RPC_NODES
from tests.unit.api_app import client, make_app


def record(node_id: str) -> dict:
    return {
        "node_id": node_id,
        "state": "ready",
        "last_seen": "2026-11-23T15:00:00Z",
        "boot_id": "b",
        "info": {},
        "running": [],
    }


async def test_out_of_range_paging_is_refused_naming_the_parameter():
    app, _, _ = await make_app()
    async with client(app) as admin:
        for query, name in (
            ("limit=0", "limit"),
            ("limit=1001", "limit"),
            ("offset=-1", "offset"),
            ("limit=ten", "limit"),
        ):
            answer = await admin.get(f"/v2/nodes?{query}")
            assert answer.status_code == 400 and f"param[{name}]" in answer.text, (query, answer.status_code)


async def test_a_page_says_the_total_and_where_the_next_one_starts():
    app, _, _ = await make_app()
    app.state.submitter.requester.broker.answers[RPC_NODES] = {"total": 3, "offset": 1, "items": [record("b")]}
    async with client(app) as admin:
        page = (await admin.get("/v2/nodes?offset=1&limit=1")).json()
        assert (page["total"], page["count"], page["next_offset"]) == (3, 1, 2)
        assert [n["node_id"] for n in page["items"]] == ["b"]
        app.state.submitter.requester.broker.answers[RPC_NODES] = {"total": 3, "offset": 2, "items": [record("c")]}
        assert (await admin.get("/v2/nodes?offset=2&limit=1")).json()["next_offset"] is None


async def test_a_monitor_from_before_paging_is_paged_here():
    app, _, _ = await make_app()
    app.state.submitter.requester.broker.answers[RPC_NODES] = [record("a"), record("b"), record("c")]
    async with client(app) as admin:
        page = (await admin.get("/v2/nodes?offset=1&limit=1")).json()
    assert [n["node_id"] for n in page["items"]] == ["b"] and page["total"] == 3 and page["next_offset"] == 2


async def test_running_tasks_show_their_project_and_a_known_jobs_project_is_read_once():
    app, db, _ = await make_app()
    await db.api_jobs.insert_one({"_id": "j1", "project_id": "vision"})
    busy = {
        **record("a"),
        "running": [
            {"job_id": "j1", "attempt": 1, "rank": 0},
            {"job_id": "claimed-by-the-agent-only", "attempt": 1, "rank": 0},
        ],
    }
    app.state.submitter.requester.broker.answers[RPC_NODES] = {"total": 1, "offset": 0, "items": [busy]}
    reads = []
    find = db.api_jobs.find
    db.api_jobs.find = lambda query, projection=None: reads.append(query) or find(query, projection)
    async with client(app) as admin:
        for _ in range(2):
            [node] = (await admin.get("/v2/nodes")).json()["items"]
            assert node["state"] == "busy" and [t["project_id"] for t in node["running"]] == ["vision", ""]
    assert [sorted(q["_id"]["$in"]) for q in reads] == [
        ["claimed-by-the-agent-only", "j1"],
        ["claimed-by-the-agent-only"],
    ]  # j1's project remembered
