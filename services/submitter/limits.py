"""Limits at the API's edge: body size, requests per user (a token bucket), live tokens per user (queued jobs per
project and user: `caps`)."""

import math
from dataclasses import dataclass, field

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.submitter import errors
from services.submitter.errors import ApiError

# A refused body is read and thrown away up to this much before the 413, so that a client still sending reads the
# answer instead of a reset connection; past it the connection just closes.
DRAIN_BYTES = 64 * 1024 * 1024


def too_large(max_bytes: int) -> dict:
    return {
        "error_code": errors.PARAM_TOO_LONG,
        "error_msg": f"param[body] invalid: the request body is larger than {max_bytes} bytes",
    }


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` gets 413 before any route sees it, whether the client announced
    its length (Content-Length) or streams it (chunked); a body within the limit is handed on unchanged."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return await _reply(
                    send,
                    400,
                    {"error_code": errors.PARAM_INVALID, "error_msg": "param[Content-Length] invalid: not a number"},
                )
            if int(length) > self.max_bytes:
                return await self._refuse(headers, receive, send, received=0)
        elif b"transfer-encoding" not in headers:
            return await self.app(scope, receive, send)  # no body at all
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                more = message.get("more_body", False)
                return await self._refuse(headers, receive if more else None, send, received=size)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, headers: dict, receive: Receive | None, send: Send, *, received: int) -> None:
        if receive is not None and headers.get(b"expect", b"").lower() != b"100-continue":
            while received < DRAIN_BYTES:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                received += len(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        await _reply(send, 413, too_large(self.max_bytes))


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read once, then the client's own messages (a disconnect, while a response streams)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _reply(send: Send, status: int, content: dict) -> None:
    response = JSONResponse(status_code=status, content=content, headers={"connection": "close"})
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


@dataclass
class TokenBucket:
    """`rate` requests a second on average, up to `burst` at once."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """0 when a request may go now (and it is counted); else the seconds until one may."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = max(self.updated, now)
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass
class RateLimiter:
    """One token bucket per key (a user: all his bearer tokens share it, so a second token does not double his
    rate); idle full buckets are forgotten past `max_keys`."""

    rate: float
    burst: float
    max_keys: int = 10_000
    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def take(self, key: str, now: float) -> float:
        bucket = self.buckets.get(key)
        if bucket is None:
            if len(self.buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self.buckets[key] = TokenBucket(self.rate, self.burst, self.burst, now)
        return bucket.take(now)

    def _forget_full(self, now: float) -> None:
        full = [k for k, b in self.buckets.items() if b.tokens + (now - b.updated) * b.rate >= b.burst]
        for key in full or list(self.buckets)[: len(self.buckets) // 2]:
            del self.buckets[key]

    def charge(self, key: str, now: float) -> None:
        """Raise 429 (406042) with Retry-After when the key (a user) has no request left."""
        wait = self.take(key, now)
        if wait > 0:
            retry = max(1, math.ceil(wait))
            raise ApiError(
                429,
                errors.TOO_MANY_REQUESTS,
                f"too many requests from user {key}: at most {self.rate:g}"
                f" a second, all his tokens together (bursts of {self.burst:g}); retry after {retry} s",
                headers={"Retry-After": str(retry)},
            )


def tokens_full(*, user_name: str, live: int, cap: int) -> ApiError | None:
    """The refusal of one more token when the user already holds `cap` live (unexpired, unrevoked) ones, else None."""
    if live < cap:
        return None
    return ApiError(
        409,
        errors.LIMIT_REACHED,
        f"param[user_name] invalid: the live token quantity of user "
        f"{user_name} has reached the upper limit ({live} of {cap} unexpired tokens); revoke one "
        f"(DELETE /v2/users/{user_name}/tokens/{{token_id}}) or wait until one expires",
    )
