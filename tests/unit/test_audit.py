"""The audit log: every change by a person is stored before it happens (or refused), with who, what, from where."""

import asyncio
import json
from datetime import UTC, datetime

import pytest

from shared.bus import RPC_CANDIDATES
from services.submitter.audit import describe
from tests.factories import job_body
from tests.memory import MemoryCollection
from tests.unit.api_app import add_user, client, make_app
from tests.unit.test_submission import CountingBroker, MemoryRepo


class Broken(MemoryCollection):
    def __init__(self, *, insert: bool = False, update: bool = False) -> None:
        super().__init__("api_audit")
        self.fail_insert, self.fail_update = insert, update

    async def insert_one(self, doc):
        if self.fail_insert:
            raise ConnectionError("database away")
        return await super().insert_one(doc)

    async def update_one(self, query, update, upsert=False):
        if self.fail_update:
            raise ConnectionError("database away")
        return await super().update_one(query, update, upsert)


async def entries(db) -> list[dict]:
    return sorted([d async for d in db.api_audit.find({})], key=lambda d: d["at_s"])


async def test_changes_are_recorded_with_who_what_and_from_where():
    app, db, store = await make_app()
    async with client(app) as admin:
        ana = (await admin.post("/v2/users", json={"user_name": "ana", "projects": ["vision"]})).json()
        await admin.put("/v2/vision/notifications", json={"webhook_url": "https://93.184.216.34:8443/h?key=s3cret"})
    async with client(app, ana["token"]) as as_ana:
        extra = (await as_ana.post("/v2/users/ana/tokens", json={"expires_in": 60})).json()
        await as_ana.delete(f"/v2/users/ana/tokens/{extra['token_id']}")
        await as_ana.get("/v2/users/ana/tokens")  # reading changes nothing and is not recorded
    records = await entries(db)
    assert [r["action"] for r in records] == ["user.create", "webhook.set", "token.create", "token.revoke"]
    user, webhook, issued, revoked = records
    assert (user["user_name"], user["target_id"], user["status"], user["state"]) == ("admin", "ana", 201, "done")
    assert user["summary"]["projects"] == ["vision"] and user["summary"]["token_id"] == ana["token_id"]
    assert user["client_ip"] == "203.0.113.7" and user["token_id"].startswith("tk_")
    assert webhook["project_id"] == "vision"
    assert webhook["summary"] == {"webhook": "https://93.184.216.34:8443", "new_secret": True}
    assert (issued["user_name"], issued["token_id"], issued["target_id"]) == ("ana", ana["token_id"], extra["token_id"])
    assert (revoked["target_id"], revoked["status"]) == (extra["token_id"], 204)
    assert "s3cret" not in json.dumps(records, default=str) and ana["token"] not in json.dumps(records, default=str)


async def test_refused_attempts_are_recorded_and_unauthenticated_ones_are_not():
    app, db, store = await make_app()
    secret = await add_user(store, "bob", ["other"])
    async with client(app, secret) as as_bob:
        assert (await as_bob.put("/v2/vision/quotas", json={"max_gpus": 1})).status_code == 403
    async with client(app, "tm_not-a-token") as stranger:
        assert (await stranger.post("/v2/users", json={"user_name": "eve"})).status_code == 401
    records = await entries(db)
    assert [(r["action"], r["user_name"], r["status"]) for r in records] == [("quota.set", "bob", 403)]


async def test_the_action_is_named_from_the_body_and_the_dry_run_is_not_a_change():
    app, db, _ = await make_app()
    async with client(app) as admin:
        missing = await admin.post("/v2/vision/training-jobs/job-x/actions", json={"action_type": "migrate"})
        assert missing.status_code == 404
        await admin.post("/v2/vision/training-jobs?dry_run=true", json={})
    [record] = await entries(db)
    assert (record["action"], record["target_id"], record["status"]) == ("job.migrate", "job-x", 404)


async def test_a_dry_run_only_a_route_reads_as_one_is_not_kept_out_of_the_log():
    app, db, _ = await make_app()
    async with client(app) as admin:
        await admin.post("/v2/vision/training-jobs?dry_run=false&dry_run=true", json={})  # a dry run: its last value
        await admin.delete("/v2/vision/training-jobs/job-x?dry_run=true")  # no such parameter: a real delete
        await admin.post("/v2/vision/training-jobs/job-y/actions?dry_run=1", json={"action_type": "terminate"})
        await admin.post("/v2/vision/training-jobs?dry_run=true&dry_run=false", json={})  # a real create
        await admin.post("/v2/vision/training-jobs?dry_run=maybe", json={})  # refused by the route: recorded
    records = sorted((r["method"], r["target_id"] or "", r["status"]) for r in await entries(db))
    assert records == [("DELETE", "job-x", 404), ("POST", "", 400), ("POST", "", 400), ("POST", "job-y", 404)]


async def test_a_change_whose_record_cannot_be_written_is_refused():
    app, db, _ = await make_app()
    app.state.audit.collection = Broken(insert=True)
    async with client(app) as admin:
        response = await admin.post("/v2/users", json={"user_name": "ana", "projects": ["vision"]})
    assert (response.status_code, response.json()["error_code"]) == (503, "406003")
    assert "nothing was changed" in response.json()["error_msg"]
    assert await db.api_users.find_one({"_id": "ana"}) is None


class Slow(MemoryCollection):
    """An audit collection whose inserts wait until released; what it saw meanwhile is kept."""

    def __init__(self, seen) -> None:
        super().__init__("api_audit")
        self.release, self.fail, self.seen = asyncio.Event(), False, seen

    async def insert_one(self, doc):
        self.seen.append("record begun")
        await self.release.wait()
        if self.fail:
            raise ConnectionError("database away")
        self.seen.append("record stored")
        return await super().insert_one(doc)


class SeenRepo(MemoryRepo):
    def __init__(self, seen) -> None:
        super().__init__()
        self.seen = seen

    async def insert_many(self, new):
        self.seen.append("job stored")
        return await super().insert_many(new)


@pytest.mark.parametrize("fails", [False, True])
async def test_a_jobs_record_is_written_while_placement_and_billing_are_asked_and_stored_before_the_job(fails):
    """A job's creation asks placement and billing (read only) while its record is written, and is stored only
    once the record is: half the wait of a submission was its record's write, made before anything else ran. A
    record that cannot be written refuses the job (503), nothing stored."""
    seen: list[str] = []
    broker = CountingBroker()
    asked = broker.request

    async def request(payload, subject, timeout=0):
        seen.append(subject)
        if subject == RPC_CANDIDATES:
            await asyncio.sleep(0)
            audit.release.set()  # placement answers only once the record's write has begun: they overlap
        return await asked(payload, subject, timeout)

    broker.request = request
    app, _, _ = await make_app(broker=broker, repo=(repo := SeenRepo(seen)))
    audit = app.state.audit.collection = Slow(seen)
    audit.fail = fails
    async with client(app) as admin, asyncio.timeout(10):  # a record awaited before placement is asked: never
        response = await admin.post("/v2/vision/training-jobs", json=job_body(name="one"))
    if fails:
        assert (response.status_code, response.json()["error_code"]) == (503, "406003")
        assert "job stored" not in seen and await repo.jobs.count_documents({}) == 0
    else:
        assert response.status_code == 201, response.text
        assert seen.index("record begun") < seen.index(RPC_CANDIDATES) < seen.index("record stored")
        assert seen.index("record stored") < seen.index("job stored")
        [record] = audit.docs.values()
        assert (record["action"], record["state"], record["status"]) == ("job.create", "done", 201)


async def test_any_other_change_waits_for_its_record_before_its_route_runs():
    seen: list[str] = []
    app, db, _ = await make_app()
    audit = app.state.audit.collection = Slow(seen)
    async with client(app) as admin:
        creating = asyncio.ensure_future(admin.post("/v2/users", json={"user_name": "ana", "projects": ["vision"]}))
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert seen == ["record begun"] and await db.api_users.find_one({"_id": "ana"}) is None
        audit.release.set()
        assert (await creating).status_code == 201


async def test_a_record_whose_outcome_cannot_be_added_stays_begun():
    app, db, _ = await make_app()
    app.state.audit.collection = Broken(update=True)
    async with client(app) as admin:
        response = await admin.post("/v2/users", json={"user_name": "ana", "projects": ["vision"]})
    assert response.status_code == 201
    [record] = app.state.audit.collection.docs.values()
    assert (record["action"], record["state"], record["status"]) == ("user.create", "begun", None)


async def test_the_log_is_for_the_admin_with_filters_and_paging():
    app, db, store = await make_app()
    secret = await add_user(store, "ana", ["vision"])
    async with client(app) as admin:
        for project in ("vision", "vision", "speech"):
            await admin.put(f"/v2/{project}/notifications", json={"webhook_url": None})
    async with client(app, secret) as as_ana:
        await as_ana.put("/v2/vision/notifications", json={"webhook_url": None})
        assert (await as_ana.get("/v2/audit")).status_code == 403
    async with client(app) as admin:
        everything = (await admin.get("/v2/audit")).json()
        assert everything["total"] == 4 and everything["items"][0]["user_name"] == "ana"  # newest first
        vision = (await admin.get("/v2/audit", params={"project": "vision", "limit": 2, "offset": 1})).json()
        assert (vision["total"], vision["count"]) == (3, 2)
        assert (await admin.get("/v2/audit", params={"user": "ana"})).json()["total"] == 1
        later = datetime.fromtimestamp(max(d["at_s"] for d in db.api_audit.docs.values()) + 1, UTC).isoformat()
        assert (await admin.get("/v2/audit", params={"from": later})).json()["total"] == 0
        assert (await admin.get("/v2/audit", params={"to": later})).json()["total"] == 4
        bad = await admin.get("/v2/audit", params={"from": later, "to": "2000-01-01T00:00:00Z"})
        assert bad.status_code == 400 and bad.json()["error_msg"].startswith("param[to]")
        assert (await admin.get("/v2/audit", params={"project": "../x"})).status_code == 400


@pytest.mark.parametrize(
    "method, route, params, body, answer, expected",
    [
        (
            "POST",
            "/v2/{project_id}/training-jobs",
            {"project_id": "p"},
            {
                "metadata": {"name": "r1"},
                "spec": {"resource": {"gpu_count": 2}},
                "algorithm": {"environments": {"HF": "x"}},
            },
            {"metadata": {"id": "job-1"}},
            ("job.create", "job-1", {"name": "r1", "gpu_count": 2, "node_count": None}),
        ),
        (
            "POST",
            "/v2/{project_id}/training-jobs/{job_id}/actions",
            {"project_id": "p", "job_id": "j"},
            {"action_type": "migrate"},
            {},
            ("job.migrate", "j", {"action_type": "migrate"}),
        ),
        (
            "DELETE",
            "/v2/{project_id}/training-jobs/{job_id}",
            {"project_id": "p", "job_id": "j"},
            {},
            {},
            ("job.delete", "j", {}),
        ),
        (
            "POST",
            "/v1/{project_id}/training-jobs",
            {"project_id": "p"},
            {"job_name": "a" * 500},
            {"job_id": "j9"},
            ("job.create", "j9", {"name": "a" * 128, "dialect": "v1"}),
        ),
        (
            "POST",
            "/v2/{project_id}/training-jobs",
            {"project_id": "p"},
            {"metadata": ["hostile"]},
            {},
            ("job.create", None, {}),
        ),
        (
            "PUT",
            "/v2/{project_id}/anything-new",
            {"project_id": "p"},
            {"secret": "x"},
            {},
            ("PUT /v2/{project_id}/anything-new", None, {}),
        ),
    ],
)
def test_describe_keeps_a_small_summary_and_never_the_secrets(method, route, params, body, answer, expected):
    assert describe(method, route, params, json.dumps(body).encode(), json.dumps(answer).encode()) == expected


def test_an_unreadable_body_is_said_so():
    assert describe("POST", "/v2/users", {}, b"{not json", b"") == ("user.create", None, {"unreadable": True})


async def test_a_refused_body_with_a_number_for_a_name_is_recorded_and_the_log_still_reads():
    app, db, store = await make_app()
    async with client(app) as admin:
        assert (await admin.post("/v2/users", json={"user_name": 1, "projects": ["vision"]})).status_code == 400
        [refused] = await entries(db)
        await db.api_audit.insert_one({**refused, "_id": "old", "at_s": 1.0, "target_id": 7})  # before ids were text
        page = await admin.get("/v2/audit")
    assert page.status_code == 200, page.text
    assert sorted(item["target_id"] for item in page.json()["items"]) == ["1", "7"]
