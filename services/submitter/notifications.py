"""Job events that need a person: kept per project and delivered to its webhook, retried with backoff."""

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import time
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Query, Request
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field

from shared.egress import Policy, Refused, check_url, guarded_client
from services.submitter.audit import url_origin
from services.submitter.auth import Principal, authenticate
from services.submitter.deps import ProjectId, use_cases
from services.submitter.notificationstore import NotificationStore
from services.submitter.refusals import Invalid

log = logging.getLogger(__name__)
router = APIRouter(tags=["notifications"])
MAX_ATTEMPTS = 8
CLAIM_S = 60.0  # longer than one delivery may take (its timeouts)
BACKOFF_S = 1.0  # doubles each failed try, capped below
MAX_BACKOFF_S = 300.0
IDLE_S = 5.0  # due notifications are looked for at least this often (another replica's, claims run out)


SECRET_PREFIX = "whsec_"  # Standard Webhooks' form: the prefix, then the key in base64
# After a rotation the secret it replaced signs too, this long, so the receiver can be given the new one first.
ROTATION_OVERLAP_S = 24 * 3600.0


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


async def deliver_forever(store: NotificationStore, *, policy: Policy, idle_s: float = IDLE_S) -> None:
    """Deliver due notifications; slow or failing webhooks never hold up the bus. Looked for as soon as this process
    keeps one, when a retry comes due, and every `idle_s` (those another replica kept and did not deliver, claims
    that ran out): a poll every half second was two reads a second whether anything came or not."""
    async with guarded_client(policy) as client:
        while True:
            store.recorded.clear()  # before the read: one kept meanwhile wakes the next wait at once
            now = time.time()
            mine = [doc for doc in await store.due(now) if await claim(store, doc, now=now)]
            retries = await asyncio.gather(*(deliver(store, client, doc) for doc in mine))
            wait = min([idle_s] + [at - time.time() for at in retries if at is not None])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(store.recorded.wait(), timeout=max(wait, 0.0))


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
    """POST once; "" when answered 2xx, else only "HTTP <status>" or "unreachable" (nothing about the network)."""
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:  # the body is never read
            if response.is_success:
                return ""
            log.warning("webhook %s answered HTTP %d", url_origin(url), response.status_code)
            return f"HTTP {response.status_code}"
    except (httpx.HTTPError, OSError) as exc:  # refused by policy, DNS, connection, TLS, timeout: all alike
        # its origin only, never its path or query (a Slack or Teams hook's secret), in the error's text too
        shown = url_origin(url) or ""
        log.warning("webhook %s unreachable: %s: %s", shown, type(exc).__name__, str(exc).replace(url, shown))
        return "unreachable"


@router.put(
    "/v2/{project_id}/notifications",
    response_model=WebhookSettings,
    summary="Where the project's notifications go, and the secret that signs them",
)
async def configure(
    project_id: ProjectId, body: NotificationSettings, request: Request, principal: Principal = Depends(authenticate)
):
    principal.require_project(project_id)
    url = str(body.webhook_url) if body.webhook_url else None
    if url:
        try:
            await check_url(request.app.state.egress, url)
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
    before = await store.webhook(project_id)
    await store.set_url(project_id, url)
    moved = before.url is not None and url_origin(before.url) != url_origin(url)
    made = None
    # A new secret for a new webhook, one set before deliveries were signed, a rotation, and a move to another
    # origin (whoever ran the old receiver holds the old secret: it must not sign for the new one).
    if body.rotate_secret or moved or not before.secret:
        candidate = new_secret()
        kept = before.secret if body.rotate_secret and not moved else None
        if await store.replace_secret(
            project_id,
            expected=before.secret,
            secret=candidate,
            previous=kept,
            previous_until=time.time() + ROTATION_OVERLAP_S if kept else 0.0,
        ):
            made = candidate  # else another request changed it first: this answer shows none (never a dead one)
    return WebhookSettings(webhook_url=url, signed=bool((await store.webhook(project_id)).secret), signing_secret=made)


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
