"""Webhooks: configuration refuses what is not public (400 naming webhook_url), delivery checks again at every
connection, follows no redirect, and stores only the HTTP status or "unreachable"."""

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from shared.egress import Policy, guarded_client
from shared.events import Notification
from services.submitter import notifications
from services.submitter.notificationstore import NotificationStore
from tests.unit.api_app import add_user, client, make_app

REFUSED = [
    "http://127.0.0.1:8080/hook",
    "http://localhost/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://[::1]:9000/hook",
    "http://[::ffff:127.0.0.1]/",
    "http://100.64.0.9/",
    "http://0.0.0.0:80/",
    "http://192.168.0.1/",
]


@pytest.mark.parametrize("url", REFUSED)
async def test_a_webhook_to_an_address_that_is_not_public_is_refused(url):
    app, db, _ = await make_app()
    async with client(app) as api:
        response = await api.put("/v2/vision/notifications", json={"webhook_url": url})
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "406001"
    assert response.json()["error_msg"].startswith("param[webhook_url] invalid:")
    assert await db.api_projects.find_one({"_id": "vision"}) is None


async def test_public_and_allow_listed_webhooks_are_kept():
    app, db, _ = await make_app(allow=["127.0.0.1"])
    async with client(app) as api:
        for url in ("https://93.184.216.34/hook", "http://127.0.0.1:5000/hook"):
            response = await api.put("/v2/vision/notifications", json={"webhook_url": url})
            assert response.status_code == 200, response.text
            assert (await db.api_projects.find_one({"_id": "vision"}))["webhook_url"] == url
        refused = await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.2:5000/hook"})
        assert refused.status_code == 400
        clear = await api.put("/v2/vision/notifications", json={"webhook_url": "http://93.184.216.34/hook"})
        assert clear.status_code == 400 and "goes over https://" in clear.json()["error_msg"], clear.text
        for secret in ("https://user:pw@93.184.216.34/hook", "https://token@93.184.216.34/hook"):
            userinfo = await api.put("/v2/vision/notifications", json={"webhook_url": secret})
            assert userinfo.status_code == 400 and "credentials in the URL" in userinfo.json()["error_msg"]
            assert userinfo.json()["error_msg"].startswith("param[webhook_url] invalid:")
        assert (await db.api_projects.find_one({"_id": "vision"}))["webhook_url"] == "http://127.0.0.1:5000/hook"


async def test_only_members_configure_a_projects_webhook():
    app, _, tokens = await make_app()
    outsider = await add_user(tokens, "bob", ["other"])
    async with client(app, outsider) as api:
        response = await api.put("/v2/vision/notifications", json={"webhook_url": "http://93.184.216.34/"})
    assert response.status_code == 403


def store(db) -> NotificationStore:
    return NotificationStore(db.api_notifications, db.api_projects)


class Receiver(BaseHTTPRequestHandler):
    hits: list[str] = []
    received: list[tuple[dict[str, str], bytes]] = []  # each POST's headers (lower-cased names) and raw body

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        Receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        Receiver.hits.append(self.path)
        if self.path.startswith("/fails"):
            self.send_response(500)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/internal-admin")
        else:
            self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Receiver.hits, Receiver.received = [], []
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


async def deliver_once(url: str, policy: Policy, secret: str | None = None, **more_of_the_project) -> dict:
    app, db, _ = await make_app()
    await db.api_projects.insert_one(
        {"_id": "vision", "webhook_url": url, "webhook_secret": secret, **more_of_the_project}
    )
    doc = {
        "_id": "n-1",
        "project_id": "vision",
        "job_id": "j-1",
        "user_name": "ana",
        "kind": "oom_unplaceable",
        "message": "too big",
        "state": "pending",
        "attempts": 0,
        "next_try": 0.0,
        "error": "",
    }
    await db.api_notifications.insert_one(doc)
    async with guarded_client(policy) as http:
        await notifications.deliver(store(db), http, doc)
    return await db.api_notifications.find_one({"_id": "n-1"})


async def test_an_allow_listed_receiver_gets_the_notification(receiver):
    stored = await deliver_once(f"{receiver}/hook", Policy.parse(["127.0.0.1"]))
    assert (stored["state"], stored["error"], Receiver.hits) == ("delivered", "", ["/hook"])


async def test_delivery_checks_again_and_says_only_unreachable(receiver):
    stored = await deliver_once(f"{receiver}/hook", Policy())  # e.g. stored before, or DNS changed since
    assert (stored["state"], stored["error"], stored["attempts"]) == ("pending", "unreachable", 1)
    assert Receiver.hits == []


async def test_a_closed_port_and_an_open_one_look_the_same():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    stored = await deliver_once(f"http://127.0.0.1:{closed}/hook", Policy.parse(["127.0.0.1"]))
    assert stored["error"] == "unreachable"


async def test_an_error_status_is_stored_as_the_status_only(receiver):
    stored = await deliver_once(f"{receiver}/fails", Policy.parse(["127.0.0.1"]))
    assert (stored["state"], stored["error"]) == ("pending", "HTTP 500")


async def test_a_redirect_is_not_followed(receiver):
    stored = await deliver_once(f"{receiver}/moved", Policy.parse(["127.0.0.1"]))
    assert stored["error"] == "HTTP 302" and Receiver.hits == ["/moved"]


async def test_of_two_api_replicas_only_one_takes_a_due_notification():
    _, db, _ = await make_app()
    await db.api_notifications.insert_one({"_id": "n1", "state": "pending", "next_try": 100.0, "attempts": 0})
    seen = [d async for d in db.api_notifications.find({"state": "pending"})]  # both replicas read it as due
    assert [await notifications.claim(store(db), doc, now=101.0) for doc in seen + seen] == [True, False]
    assert (await db.api_notifications.find_one({"_id": "n1"}))["next_try"] == 101.0 + notifications.CLAIM_S


async def stopped(loop: asyncio.Task) -> None:
    """The delivery loop cancelled and waited for: it has ended (nothing of it runs on into the next test) and
    ended by its cancellation, not by an error of its own."""
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop


async def test_the_delivery_loop_takes_what_is_due():
    _, db, _ = await make_app()
    await db.api_notifications.insert_one(
        {"_id": "n2", "project_id": "nowhere", "state": "pending", "next_try": 0.0, "attempts": 0}
    )
    loop = asyncio.create_task(notifications.deliver_forever(store(db), policy=Policy.parse([]), idle_s=0.01))
    try:
        for _ in range(200):
            if (await db.api_notifications.find_one({"_id": "n2"}))["state"] != "pending":
                break
            await asyncio.sleep(0.01)
    finally:
        await stopped(loop)
    assert (await db.api_notifications.find_one({"_id": "n2"}))["state"] == "kept"  # no webhook: kept for the API


async def test_delivery_reads_when_a_notification_is_kept_not_twice_a_second():
    _, db, _ = await make_app()
    notes, reads = store(db), []
    due = notes.due

    async def counted_due(now: float) -> list[dict]:
        reads.append(now)
        return await due(now)

    notes.due = counted_due  # type: ignore[method-assign]
    loop = asyncio.create_task(notifications.deliver_forever(notes, policy=Policy(), idle_s=60))
    try:
        await asyncio.sleep(1.0)
        assert len(reads) == 1  # a read every half second before, whether anything came or not
        await notes.record(
            Notification(event_id="n-1", project_id="vision", job_id="j-1", user_name="ana", kind="hung", message="m")
        )
        for _ in range(500):
            if (await db.api_notifications.find_one({"_id": "n-1"}))["state"] != "pending":
                break
            await asyncio.sleep(0.01)
    finally:
        await stopped(loop)
    assert (await db.api_notifications.find_one({"_id": "n-1"}))["state"] == "kept"  # no webhook: kept at once
    assert len(reads) == 2


async def test_the_log_names_a_failing_webhook_by_its_origin_never_its_secret_path(receiver, caplog):
    secret = "/services/T000/B000/XXXXsecretXXXX?token=hunter2"  # a Slack hook's secret is its path
    with caplog.at_level("WARNING", logger=notifications.log.name):
        await deliver_once(f"{receiver}/fails{secret}", Policy.parse(["127.0.0.1"]))  # answered HTTP 500
        await deliver_once(f"{receiver}{secret}", Policy())  # refused by the policy
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert receiver in logged and "HTTP 500" in logged and "unreachable" in logged
    assert "secret" not in logged and "hunter2" not in logged and "T000" not in logged


async def test_no_library_logs_a_webhooks_secret_path_at_the_services_level(receiver, caplog):
    """httpx says every request's URL at INFO: the services' logging (`configure_logging`) keeps it to warnings."""
    from shared.service import configure_logging

    configure_logging("INFO")
    secret = "/services/T000/B000/XXXXsecretXXXX"
    with caplog.at_level("INFO"):
        await deliver_once(f"{receiver}{secret}", Policy.parse(["127.0.0.1"]))
    assert Receiver.hits == [secret]
    assert "XXXXsecretXXXX" not in "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)


def verified(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """A receiver's check, written from the Standard Webhooks spec (not from the code under test)."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = [s.split(",", 1)[1] for s in headers["webhook-signature"].split(" ") if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, o) for o in offered)


async def test_a_webhook_gets_a_signing_secret_shown_once_and_kept_across_url_changes():
    app, db, _ = await make_app(allow=["127.0.0.1"])
    async with client(app) as api:
        first = (await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"})).json()
        secret = first["signing_secret"]
        assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32 and first["signed"]
        moved = (await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/b"})).json()
        assert moved["signing_secret"] is None and moved["signed"]  # the receiver keeps the secret it has
        shown = await api.get("/v2/vision/notifications")
        assert shown.json()["signed"] and secret not in shown.text and secret[6:] not in shown.text
        rotated = await api.put(
            "/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/b", "rotate_secret": True}
        )
        assert rotated.json()["signing_secret"] not in (None, secret)
        cleared = (await api.put("/v2/vision/notifications", json={"webhook_url": None})).json()
        assert cleared == {"webhook_url": None, "signed": False, "signing_secret": None}
        assert (await db.api_projects.find_one({"_id": "vision"}))["webhook_secret"] is None
        again = (await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"})).json()
        assert again["signing_secret"] not in (None, secret, rotated.json()["signing_secret"])
        audit = [d async for d in db.api_audit.find({})]
        assert [d["summary"]["new_secret"] for d in audit if d["action"] == "webhook.set"] == [
            True,
            False,
            True,
            False,
            True,
        ]
        assert not any(
            s[6:] in str(d) for d in audit for s in (secret, again["signing_secret"], rotated.json()["signing_secret"])
        )


async def test_a_delivery_is_signed_so_the_receiver_can_tell_it_from_a_forgery(receiver):
    secret = notifications.new_secret()
    before = time.time()
    stored = await deliver_once(f"{receiver}/hook", Policy.parse(["127.0.0.1"]), secret=secret)
    assert stored["state"] == "delivered"
    [(headers, body)] = Receiver.received
    assert headers["webhook-id"] == "n-1" and before - 1 <= int(headers["webhook-timestamp"]) <= time.time() + 1
    assert headers["content-type"] == "application/json" and json.loads(body)["job_id"] == "j-1"
    assert verified(secret, headers, body)
    assert not verified(secret, headers, body.replace(b"too big", b"all fine"))  # a changed body fails
    assert not verified(notifications.new_secret(), headers, body)  # another project's secret fails


async def test_a_webhook_set_before_signing_is_delivered_unsigned(receiver):
    stored = await deliver_once(f"{receiver}/hook", Policy.parse(["127.0.0.1"]))
    [(headers, body)] = Receiver.received
    assert stored["state"] == "delivered" and "webhook-signature" not in headers and json.loads(body)["id"] == "n-1"


async def test_two_requests_making_a_secret_at_once_never_show_one_that_is_not_kept():
    """Read, then write: two replicas (or a client's retry) each showed a secret of their own and only the last was
    stored; the receiver given the first refused every delivery (found by review)."""
    app, db, _ = await make_app(allow=["127.0.0.1"])
    notes = use_cases_store(app)
    read = notes.webhook

    async def slow_read(project_id):  # both requests read before either writes
        hook = await read(project_id)
        await asyncio.sleep(0.05)
        return hook

    notes.webhook = slow_read  # type: ignore[method-assign]
    async with client(app) as api:
        answers = await asyncio.gather(
            *(api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"}) for _ in range(2))
        )
    stored = (await db.api_projects.find_one({"_id": "vision"}))["webhook_secret"]
    assert sorted(a.json()["signing_secret"] or "" for a in answers) == ["", stored]


def use_cases_store(app) -> NotificationStore:
    return app.state.submitter.repo.notifications


async def test_a_rotation_without_the_webhook_is_refused_and_changes_nothing():
    app, db, _ = await make_app(allow=["127.0.0.1"])
    async with client(app) as api:
        await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"})
        before = await db.api_projects.find_one({"_id": "vision"})
        refused = await api.put("/v2/vision/notifications", json={"rotate_secret": True})
    assert refused.status_code == 400 and refused.json()["error_msg"].startswith("param[rotate_secret] invalid:")
    assert await db.api_projects.find_one({"_id": "vision"}) == before  # the webhook was dropped before


async def test_a_webhook_moved_to_another_host_gets_a_new_secret_and_the_old_one_stops(receiver):
    app, db, _ = await make_app(allow=["127.0.0.1", "127.0.0.2"])
    async with client(app) as api:
        old = (await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.2:5000/a"})).json()
        moved = (await api.put("/v2/vision/notifications", json={"webhook_url": f"{receiver}/hook"})).json()
    assert moved["signing_secret"] not in (None, old["signing_secret"])
    stored = await db.api_projects.find_one({"_id": "vision"})
    assert (stored["webhook_secret"], stored["webhook_secret_previous"]) == (moved["signing_secret"], None)


async def test_after_a_rotation_both_secrets_sign_for_a_day_then_only_the_new_one(receiver):
    old, new = notifications.new_secret(), notifications.new_secret()
    overlap = {"webhook_secret_previous": old, "webhook_secret_previous_until": time.time() + 60}
    await deliver_once(f"{receiver}/hook", Policy.parse(["127.0.0.1"]), secret=new, **overlap)
    [(headers, body)] = Receiver.received
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verified(new, headers, body) and verified(old, headers, body)  # a receiver not yet given the new one
    Receiver.received.clear()
    overlap["webhook_secret_previous_until"] = time.time() - 1
    await deliver_once(f"{receiver}/hook", Policy.parse(["127.0.0.1"]), secret=new, **overlap)
    [(headers, body)] = Receiver.received
    assert verified(new, headers, body) and not verified(old, headers, body)


async def test_a_rotation_keeps_the_old_secret_for_the_overlap_only():
    app, db, _ = await make_app(allow=["127.0.0.1"])
    async with client(app) as api:
        first = (await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"})).json()
        body = {"webhook_url": "http://127.0.0.1:5000/a", "rotate_secret": True}
        rotated = (await api.put("/v2/vision/notifications", json=body)).json()
    stored = await db.api_projects.find_one({"_id": "vision"})
    assert (stored["webhook_secret"], stored["webhook_secret_previous"]) == (
        rotated["signing_secret"],
        first["signing_secret"],
    )
    left = stored["webhook_secret_previous_until"] - time.time()
    assert notifications.ROTATION_OVERLAP_S - 60 < left <= notifications.ROTATION_OVERLAP_S


@pytest.fixture
async def trickler():
    """A receiver that answers a byte of its status line every 0.1 s, never ending its headers."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 10_000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()


def pending(notification_id: str, project_id: str) -> dict:
    return {
        "_id": notification_id,
        "project_id": project_id,
        "job_id": "j-1",
        "user_name": "ana",
        "kind": "hung",
        "message": "m",
        "state": "pending",
        "attempts": 0,
        "next_try": 0.0,
        "error": "",
    }


async def test_a_receiver_that_trickles_its_answer_holds_up_neither_other_projects_nor_itself_for_long(
    receiver, trickler, monkeypatch
):
    """Each read had its own 5-s timeout and the loop waited for every delivery of a look before the next: a
    receiver sending its headers a byte at a time held every project's notifications for good (found by review)."""
    monkeypatch.setattr(notifications, "DELIVERY_S", 1.0)
    _, db, _ = await make_app()
    await db.api_projects.insert_many(
        [{"_id": "slow", "webhook_url": f"{trickler}/hook"}, {"_id": "vision", "webhook_url": f"{receiver}/hook"}]
    )
    await db.api_notifications.insert_many([pending(f"s-{i}", "slow") for i in range(6)])
    loop = asyncio.create_task(
        notifications.deliver_forever(
            store(db), policy=Policy.parse(["127.0.0.1"]), idle_s=0.05, max_in_flight=5, per_project=2
        )
    )
    try:
        await asyncio.sleep(0.3)  # the slow project's first two are under way
        await db.api_notifications.insert_one(pending("v-1", "vision"))
        started = time.monotonic()
        while (await db.api_notifications.find_one({"_id": "v-1"}))["state"] != "delivered":
            assert time.monotonic() - started < 0.8, "another project's delivery waited for the slow receiver"
            await asyncio.sleep(0.02)
        slow = [d async for d in db.api_notifications.find({"project_id": "slow"})]
        assert sum(d["attempts"] for d in slow) == 0  # at most two of them under way, none ended yet
        await asyncio.sleep(1.2)  # past DELIVERY_S: the first two cut, said unreachable, two more begun
        tried = [d async for d in db.api_notifications.find({"project_id": "slow", "attempts": 1})]
        assert len(tried) == 2 and all(d["error"] == "unreachable" and d["state"] == "pending" for d in tried)
    finally:
        await stopped(loop)
    assert Receiver.hits == ["/hook"]


async def test_a_webhook_changed_by_other_requests_each_time_is_refused_and_left_as_they_made_it():
    """The URL and a new secret are one conditional write: a request that read the settings before another changed
    them reads again (never writes a new URL beside a secret it did not see), and gives up after three tries."""
    app, db, _ = await make_app(allow=["127.0.0.1"])
    notes = use_cases_store(app)
    read = notes.webhook
    async with client(app) as api:
        await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:5000/a"})
        before = await db.api_projects.find_one({"_id": "vision"})
        reads = []

        async def stale(project_id):  # what the settings were before another request's change
            reads.append(project_id)
            hook = await read(project_id)
            return dataclasses.replace(hook, secret=notifications.new_secret()) if len(reads) < 9 else hook

        notes.webhook = stale  # type: ignore[method-assign]
        refused = await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:6000/b"})
        assert refused.status_code == 409 and refused.json()["error_code"] == "406043", refused.text
        assert refused.headers["Retry-After"] == "1" and len(reads) == notifications.CONFIGURE_TRIES
        assert await db.api_projects.find_one({"_id": "vision"}) == before
        reads.extend(["x"] * 5)  # the next read is fresh
        moved = await api.put("/v2/vision/notifications", json={"webhook_url": "http://127.0.0.1:6000/b"})
    assert moved.status_code == 200 and moved.json()["signing_secret"] not in (None, before["webhook_secret"])
    stored = await db.api_projects.find_one({"_id": "vision"})
    assert (stored["webhook_url"], stored["webhook_secret"]) == (
        "http://127.0.0.1:6000/b",
        moved.json()["signing_secret"],
    )


async def test_plain_http_stays_for_hosts_inside_a_network_the_operator_allows():
    app, db, _ = await make_app(allow=["10.0.0.0/8"])
    async with client(app) as api:
        kept = await api.put("/v2/vision/notifications", json={"webhook_url": "http://10.1.2.3:8080/hook"})
    assert kept.status_code == 200, kept.text
    assert (await db.api_projects.find_one({"_id": "vision"}))["webhook_url"] == "http://10.1.2.3:8080/hook"


async def test_a_look_the_database_did_not_answer_stops_no_delivery_under_way(receiver, trickler, monkeypatch):
    """A failed read of what is due ended the loop, which cancelled every delivery under way (each then waited
    out its claim and may reach its receiver twice; found by review): the loop looks again a second later."""
    from pymongo.errors import AutoReconnect

    monkeypatch.setattr(notifications, "DELIVERY_S", 1.5)
    _, db, _ = await make_app()
    await db.api_projects.insert_many(
        [{"_id": "slow", "webhook_url": f"{trickler}/hook"}, {"_id": "vision", "webhook_url": f"{receiver}/hook"}]
    )
    await db.api_notifications.insert_one(pending("s-1", "slow"))
    notes = store(db)
    due, failures = notes.due, [1]

    async def flaky(now: float) -> list[dict]:
        if failures and await db.api_notifications.find_one({"_id": "s-1", "next_try": {"$gt": 0.0}}):
            failures.pop()  # once the slow one is under way
            raise AutoReconnect("the database went away")
        return await due(now)

    notes.due = flaky  # type: ignore[method-assign]
    loop = asyncio.create_task(notifications.deliver_forever(notes, policy=Policy.parse(["127.0.0.1"]), idle_s=0.05))
    try:
        await asyncio.sleep(0.3)
        assert not failures  # the failed look happened
        await db.api_notifications.insert_one(pending("v-1", "vision"))
        for _ in range(300):
            if (await db.api_notifications.find_one({"_id": "s-1"}))["attempts"]:
                break
            await asyncio.sleep(0.02)
        slow = await db.api_notifications.find_one({"_id": "s-1"})
        assert (slow["attempts"], slow["error"]) == (1, "unreachable")  # ran to its own end, not cancelled
        assert (await db.api_notifications.find_one({"_id": "v-1"}))["state"] == "delivered"
    finally:
        await stopped(loop)
