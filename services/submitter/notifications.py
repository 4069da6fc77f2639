"""Job events that need a person: kept per project and delivered to its webhook, retried with backoff."""

import asyncio
import base64
import functools
import hashlib
import hmac
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from fastapi import APIRouter, Depends, Query, Request
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from shared.bus import TRANSIENT_ERRORS
from shared.egress import Policy, Refused, check_url, guarded_client
from services.submitter.audit import url_origin
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import ProjectId, use_cases
from services.submitter.notificationstore import NewSecret, NotificationStore
from services.submitter.refusals import Conflicted, Invalid

log = logging.getLogger(__name__)
router = APIRouter(tags=["notifications"])
MAX_ATTEMPTS = 8
CLAIM_S = 60.0  # longer than one delivery may take (its timeouts)
BACKOFF_S = 1.0  # doubles each failed try, capped below
MAX_BACKOFF_S = 300.0
AWAY_RETRY_S = 1.0  # the next look after the database did not answer one
IDLE_S = 5.0  # due notifications are looked for at least this often (another replica's, claims run out)
DELIVERY_S = 10.0  # one try in all: connecting, sending, the answer's status line and headers (CLAIM_S is longer)
MAX_IN_FLIGHT = 32  # deliveries under way at once in one API process (its HTTP client holds as many connections)
PER_PROJECT_IN_FLIGHT = 4  # of them, one project's: a slow receiver holds up only its own project's next ones


SECRET_PREFIX = "whsec_"  # Standard Webhooks' form: the prefix, then the key in base64
# After a rotation the secret it replaced signs too, this long, so the receiver can be given the new one first.
ROTATION_OVERLAP_S = 24 * 3600.0
CONFIGURE_TRIES = 3  # reads and conditional writes of a webhook's settings, while other requests change them


class NotificationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    webhook_url: AnyHttpUrl | None = Field(None, description="POSTed a JSON notification; none: keep them only.")
    rotate_secret: bool = Field(
        False,
        description="Sign deliveries with a new secret from now on (shown once, in the answer); the one it replaces "
        "signs too for 24 hours.",
    )


class WebhookSettings(BaseModel):
    webhook_url: str | None
    signed: bool = Field(description="Deliveries carry a Standard Webhooks signature (webhook-signature).")
    signing_secret: str | None = Field(
        None,
        description="The secret deliveries are signed with, shown only in the answer that made it (a new webhook, "
        "rotate_secret, or a move to another scheme, host or port); keep it with the receiver. Null in an answer "
        "whose secret another request changed first.",
    )


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signature_headers(secrets_: list[str], message_id: str, body: bytes, *, now: float) -> dict[str, str]:
    """Standard Webhooks (standardwebhooks.com) signing: HMAC-SHA256 with each secret's key over
    `<id>.<timestamp>.<body>`, the signatures space-separated; a receiver checks one of them, and that the timestamp
    is recent, before it trusts the body."""
    timestamp = str(int(now))
    signed = f"{message_id}.{timestamp}.".encode() + body
    signatures = [
        "v1,"
        + base64.b64encode(
            hmac.new(base64.b64decode(s.removeprefix(SECRET_PREFIX)), signed, hashlib.sha256).digest()
        ).decode()
        for s in secrets_
    ]
    return {"webhook-id": message_id, "webhook-timestamp": timestamp, "webhook-signature": " ".join(signatures)}


def backoff(attempts: int) -> float:
    return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (attempts - 1))


class Deliveries:
    """The deliveries under way in this process: at most `max_in_flight` at once, `per_project` of one project's,
    each its own task, so a receiver that answers slowly (or trickles its answer a byte at a time) holds up its own
    project's next ones only, for at most `DELIVERY_S` each; what is due and left for lack of room is taken as soon
    as a delivery ends."""

    def __init__(self, *, max_in_flight: int, per_project: int) -> None:
        self.max_in_flight, self.per_project = max_in_flight, per_project
        self.projects: dict[str, str] = {}  # notification id -> its project, while its delivery runs
        self.tasks: set[asyncio.Task] = set()
        self.retries: list[float] = []  # next tries of deliveries that ended (Unix seconds)
        self.left = False  # the last look left due notifications for lack of room
        self.deadline = math.inf  # when the loop looks again unless woken
        self.woken = asyncio.Event()

    def room(self, doc: dict[str, Any]) -> bool:
        project = doc.get("project_id")
        fits = (
            doc["_id"] not in self.projects
            and len(self.projects) < self.max_in_flight
            and sum(p == project for p in self.projects.values()) < self.per_project
        )
        self.left |= not fits
        return fits

    def start(self, doc: dict[str, Any], delivery: Awaitable[float | None]) -> None:
        self.projects[doc["_id"]] = doc.get("project_id", "")
        task = asyncio.ensure_future(delivery)
        self.tasks.add(task)
        task.add_done_callback(functools.partial(self._ended, doc["_id"]))

    def _ended(self, notification_id: str, task: asyncio.Task) -> None:
        self.projects.pop(notification_id, None)
        self.tasks.discard(task)
        if task.cancelled():
            return
        at = None
        if (error := task.exception()) is not None:  # its claim runs out: tried again after CLAIM_S
            log.error("delivering notification %s failed: %r", notification_id, error)
        elif (at := task.result()) is not None:
            self.retries.append(at)
        if self.left or (at is not None and at < self.deadline):
            self.woken.set()

    def wait_s(self, looked: float, now: float, idle_s: float) -> float:
        """Until the next look: a retry that comes due after the look read what was due (`looked`), else `idle_s`."""
        self.retries = [at for at in self.retries if at > looked]
        self.deadline = min([now + idle_s, *self.retries])
        return max(self.deadline - now, 0.0)

    async def cancel(self) -> None:
        """Every delivery under way stopped, and waited for (its claim runs out: tried again after CLAIM_S)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def deliver_forever(
    store: NotificationStore,
    *,
    policy: Policy,
    idle_s: float = IDLE_S,
    max_in_flight: int = MAX_IN_FLIGHT,
    per_project: int = PER_PROJECT_IN_FLIGHT,
) -> None:
    """Deliver due notifications; slow or failing webhooks never hold up the bus, nor another project's webhook.
    Looked for as soon as this process keeps one, when a retry comes due, when a delivery ends that made room for
    one left, and every `idle_s` (those another replica kept and did not deliver, claims that ran out): a poll every
    half second was two reads a second whether anything came or not."""
    flights = Deliveries(max_in_flight=max_in_flight, per_project=per_project)
    async with guarded_client(policy, max_connections=max_in_flight) as client:
        try:
            while True:
                store.recorded.clear()  # before the read: one kept meanwhile wakes the next wait at once
                flights.woken.clear()
                flights.left = False
                now = time.time()
                try:
                    for doc in await store.due(now):
                        if flights.room(doc) and await claim(store, doc, now=now):
                            flights.start(doc, deliver(store, client, doc))
                except TRANSIENT_ERRORS as exc:  # the database away: deliveries under way go on, looked again
                    log.warning("notifications due not read (%r): looked for again", exc)
                    flights.left = True
                wait = flights.wait_s(now, time.time(), min(idle_s, AWAY_RETRY_S) if flights.left else idle_s)
                woken = [asyncio.ensure_future(e.wait()) for e in (store.recorded, flights.woken)]
                try:
                    await asyncio.wait(woken, timeout=max(wait, 0.0), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in woken:
                        waiter.cancel()
        finally:  # before the client closes: no delivery runs on with it closed
            await flights.cancel()


async def claim(store: NotificationStore, doc: dict[str, Any], *, now: float) -> bool:
    """Whether this replica of the API delivers it now: the first to move its next try on takes it (the others,
    and this one should it die mid-delivery, see it again only after CLAIM_S)."""
    return await store.claim(doc, until=now + CLAIM_S)


async def deliver(store: NotificationStore, client: httpx.AsyncClient, doc: dict[str, Any]) -> float | None:
    """Try one notification; when its next try is (Unix seconds), None when there is none."""
    hook = await store.webhook(doc["project_id"])
    url = hook.url
    if not url:
        await store.tried(doc["_id"], {"state": "kept"})
        return None
    payload = {k: doc[k] for k in ("project_id", "job_id", "user_name", "kind", "message")}
    payload["id"] = doc["_id"]
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"content-type": "application/json"}
    now = time.time()
    if signing := hook.secrets(now):  # signed at each try: its timestamp is the try's
        headers |= signature_headers(signing, doc["_id"], body, now=now)
    attempts = doc["attempts"] + 1
    error = await post(client, url, body, headers)
    next_try = time.time() + backoff(attempts) if error and attempts < MAX_ATTEMPTS else None
    if not error:
        update: dict[str, Any] = {"state": "delivered", "attempts": attempts, "error": ""}
    else:
        update = {
            "state": "failed" if next_try is None else "pending",
            "attempts": attempts,
            "error": error,
            "next_try": next_try if next_try is not None else time.time() + backoff(attempts),
        }
    await store.tried(doc["_id"], update)
    return next_try


async def post(client: httpx.AsyncClient, url: str, body: bytes, headers: dict[str, str]) -> str:
    """POST once; "" when answered 2xx, else only "HTTP <status>" or "unreachable" (nothing about the network). The
    client's timeout bounds each read; `DELIVERY_S` the whole try (a receiver trickling its headers a byte at a
    time held a delivery for ever)."""
    try:
        async with (
            asyncio.timeout(DELIVERY_S),
            client.stream("POST", url, content=body, headers=headers) as response,  # the body is never read
        ):
            if response.is_success:
                return ""
            log.warning("webhook %s answered HTTP %d", url_origin(url), response.status_code)
            return f"HTTP {response.status_code}"
    except (httpx.HTTPError, OSError, TimeoutError) as exc:  # refused by policy, DNS, connection, TLS, timeout: alike
        # its origin only, never its path or query (a Slack or Teams hook's secret), in the error's text too
        shown = url_origin(url) or ""
        log.warning("webhook %s unreachable: %s: %s", shown, type(exc).__name__, str(exc).replace(url, shown))
        return "unreachable"


def refuse_plain_http(policy: Policy, url: str) -> None:
    """Refused: a plain http:// webhook to a host the operator does not allow (its deliveries, the project's
    notifications, would cross networks in clear); http:// stays for hosts it allows by name and addresses in
    networks it allows, judged without DNS (a name's addresses may change after this check)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or policy.allows(parts.hostname):
        return
    raise Refused(
        f"{parts.hostname} is not a host the operator allows by name nor an address in a network it allows: a "
        "webhook to it goes over https://"
    )


@router.put(
    "/v2/{project_id}/notifications",
    response_model=WebhookSettings,
    summary="Where the project's notifications go, and the secret that signs them",
)
async def configure(
    project_id: ProjectId, body: NotificationSettings, request: Request, principal: Principal = Depends(authenticate)
):
    principal.require_project(project_id)
    hook, url = body.webhook_url, str(body.webhook_url) if body.webhook_url else None
    if hook is not None and url:
        if hook.username or hook.password:
            raise Invalid(
                "webhook_url",
                "credentials in the URL (user:password@) are not taken: every member of the project is shown the "
                "URL; a receiver tells deliveries apart by their signature (webhook-signature)",
            )
        try:
            await check_url(request.app.state.egress, url)
            refuse_plain_http(request.app.state.egress, url)
        except Refused as exc:
            raise Invalid(
                "webhook_url",
                f"{exc}; webhooks go to public addresses only (an operator may allow "
                "hosts: TRAINMASTER_WEBHOOK_ALLOW_HOSTS)",
            ) from None
    store = use_cases(request).repo.notifications
    if not url:
        if body.rotate_secret:
            raise Invalid("rotate_secret", "a secret signs a webhook's deliveries: give the webhook_url with it")
        await store.clear(project_id)
        return WebhookSettings(webhook_url=None, signed=False)
    for _ in range(CONFIGURE_TRIES):
        before = await store.webhook(project_id)
        moved = before.url is not None and url_origin(before.url) != url_origin(url)
        made = None
        # A new secret for a new webhook, one set before deliveries were signed, a rotation, and a move to another
        # origin (whoever ran the old receiver holds the old secret: it must not sign for the new one).
        if body.rotate_secret or moved or not before.secret:
            kept = before.secret if body.rotate_secret and not moved else None
            made = NewSecret(new_secret(), kept, time.time() + ROTATION_OVERLAP_S if kept else 0.0)
        if await store.point(project_id, url, expected=before.secret, secret=made):
            signed = bool(made or before.secret)
            return WebhookSettings(webhook_url=url, signed=signed, signing_secret=made.secret if made else None)
    raise Conflicted("webhook_url", "another request changed the project's webhook at the same time; try again")


@router.get("/v2/{project_id}/notifications", summary="The project's notification settings and recent ones")
async def recent(
    project_id: ProjectId,
    request: Request,
    principal: Principal = Depends(authenticate),
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> dict:
    principal.require_project(project_id)
    store = use_cases(request).repo.notifications
    docs = await store.recent(project_id, limit=limit)
    items = [
        {
            "id": d["_id"],
            **{k: d[k] for k in ("job_id", "user_name", "kind", "message", "state", "attempts", "error")},
            "created_at": d["created_at"].isoformat(),
        }
        for d in docs
    ]
    hook = await store.webhook(project_id)
    return {"webhook_url": hook.url, "signed": bool(hook.url and hook.secret), "count": len(items), "items": items}
