"""The portal's pages carry a Content-Security-Policy and run no inline script; every answer says nosniff and sends
no referrer; /v2/nodes shows other projects' jobs only to the admin."""

import re
from pathlib import Path

from shared.bus import RPC_NODES
from tests.unit.api_app import add_user, client, make_app

UI = Path(__file__).resolve().parents[2] / "services" / "submitter" / "ui"


async def test_portal_pages_have_a_strict_content_security_policy():
    app, _, _ = await make_app()
    async with client(app, None) as anonymous:
        for path in ("/ui/", "/ui/jobs", "/ui/app.js", "/ui/boot.js"):
            response = await anonymous.get(path)
            assert response.status_code == 200, path
            policy = dict(p.strip().split(" ", 1) for p in response.headers["content-security-policy"].split(";"))
            assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'"
            assert "unsafe-inline" not in policy["script-src"] and "unsafe-eval" not in policy.get("default-src", "")


async def test_every_answer_says_nosniff_and_no_referrer():
    app, _, _ = await make_app()
    async with client(app, None) as anonymous, client(app) as admin:
        for response in (
            await anonymous.get("/v2/me"),
            await admin.get("/v2/me"),
            await anonymous.get("/ui/"),
            await admin.put("/v2/p/notifications", json={"webhook_url": "http://127.0.0.1/"}),
        ):
            assert response.headers["x-content-type-options"] == "nosniff"
            assert response.headers["referrer-policy"] == "no-referrer"


def test_the_pages_hold_no_inline_script_and_tokens_stay_in_the_session_by_default():
    html = (UI / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert not re.search(r"\son[a-z]+\s*=", html)
    remember = re.search(r'<input id="login-remember"[^>]*>', html).group(0)
    assert "checked" not in remember
    js = (UI / "app.js").read_text()
    assert "(remember ? localStorage : sessionStorage).setItem(KEY" in js


def nodes_answer() -> list[dict]:
    return [
        {
            "node_id": "local-1",
            "state": "ready",
            "last_seen": "2026-11-23T15:00:00Z",
            "boot_id": "b",
            "info": {"kind": "local"},
            "running": [
                {"job_id": "job-mine", "attempt": 1, "rank": 0},
                {"job_id": "job-theirs", "attempt": 2, "rank": 0},
                {"job_id": "job-unknown", "attempt": 1, "rank": 0},
            ],
        },
        {"node_id": "local-2", "state": "ready", "last_seen": "2026-11-23T15:00:00Z", "info": {}, "running": []},
    ]


async def test_a_member_sees_only_his_projects_jobs_on_each_node():
    app, db, store = await make_app()
    app.state.submitter.requester.broker.answers[RPC_NODES] = nodes_answer()
    await db.api_jobs.insert_one({"_id": "job-mine", "project_id": "vision"})
    await db.api_jobs.insert_one({"_id": "job-theirs", "project_id": "speech"})
    secret = await add_user(store, "ana", ["vision"])
    async with client(app, secret) as as_ana:
        node, idle = (await as_ana.get("/v2/nodes")).json()["items"]
    assert node["running"] == [{"job_id": "job-mine", "attempt": 1, "rank": 0, "project_id": "vision"}]
    assert node["other_tasks"] == 2 and node["state"] == "busy"
    assert "job-theirs" not in str(node) and (idle["running"], idle["other_tasks"]) == ([], 0)
    async with client(app) as admin:
        node, _ = (await admin.get("/v2/nodes")).json()["items"]
    assert [t["job_id"] for t in node["running"]] == ["job-mine", "job-theirs", "job-unknown"]
    assert node["other_tasks"] == 0
