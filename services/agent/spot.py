"""Spot preemption: the agent of a spot node watches the instance metadata for the interruption notice (about two
minutes ahead on EC2) and a rebalance recommendation. On a notice it snapshots and stops its tasks (SIGTERM: the
checkpoint contract) and leaves; their attempts are requeued and the jobs resume elsewhere from the checkpoint."""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from shared.events import NodeInterrupted

log = logging.getLogger(__name__)
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
TOKEN = "/latest/api/token"
TOKEN_TTL_S = 21600


@dataclass(frozen=True)
class Notice:
    kind: str  # "interruption" or "rebalance"
    action: str  # terminate, stop, hibernate; "rebalance" for a recommendation
    time: str


def parse_notice(kind: str, status: int, body: bytes) -> Notice | None:
    """A metadata answer as a notice; None when there is none (404) or it cannot be read (hostile or garbled)."""
    if status != 200 or len(body) > 4096:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    if kind == "interruption":
        action, when = doc.get("action"), doc.get("time")
        if action in ("terminate", "stop", "hibernate") and isinstance(when, str):
            return Notice(kind=kind, action=action, time=when[:40])
        return None
    when = doc.get("noticeTime")
    return Notice(kind=kind, action="rebalance", time=when[:40]) if isinstance(when, str) else None


class SpotWatcher:
    """Polls the metadata service; calls `on_notice` once, for an interruption (or a rebalance if asked)."""

    def __init__(
        self,
        *,
        url: str,
        on_notice: Callable[[Notice], Awaitable[None]],
        poll_s: float = 5.0,
        act_on_rebalance: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        self.on_notice = on_notice
        self.poll_s = poll_s
        self.act_on_rebalance = act_on_rebalance
        self.token: str | None = None
        self.rebalance_seen = False

    async def run(self) -> Notice:
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0, trust_env=False) as client:
            while True:
                notice = await self.check(client)
                if notice:
                    await self.on_notice(notice)
                    return notice
                await asyncio.sleep(self.poll_s)

    async def check(self, client: httpx.AsyncClient) -> Notice | None:
        """One look at both paths; errors are logged and mean no notice (the next poll tries again)."""
        try:
            interruption = await self._get(client, INSTANCE_ACTION, "interruption")
            if interruption:
                log.warning("spot interruption notice: %s at %s", interruption.action, interruption.time)
                return interruption
            rebalance = await self._get(client, REBALANCE, "rebalance")
            if rebalance and not self.rebalance_seen:
                self.rebalance_seen = True
                log.warning(
                    "spot rebalance recommendation at %s%s",
                    rebalance.time,
                    ": leaving now" if self.act_on_rebalance else "",
                )
                if self.act_on_rebalance:
                    return rebalance
        except httpx.HTTPError as exc:
            log.debug("instance metadata unreachable: %r", exc)
        return None

    async def _get(self, client: httpx.AsyncClient, path: str, kind: str) -> Notice | None:
        headers = await self._token_header(client)
        reply = await client.get(path, headers=headers)
        if reply.status_code == 401 and headers:  # the token expired
            self.token = None
            reply = await client.get(path, headers=await self._token_header(client))
        return parse_notice(kind, reply.status_code, reply.content)

    async def _token_header(self, client: httpx.AsyncClient) -> dict[str, str]:
        """IMDSv2 (the provider requires it); without a token endpoint, plain IMDSv1-style reads."""
        if self.token is None:
            reply = await client.put(TOKEN, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            self.token = reply.text.strip()[:512] if reply.status_code == 200 else ""
        return {"X-aws-ec2-metadata-token": self.token} if self.token else {}


def leave_on_notice(agent: Any, *, exit_process: Callable[[], None]) -> Callable[[Notice], Awaitable[None]]:
    """What a notice does: tell placement (the node gets no more work and is given back), snapshot and stop every
    task (their ends reported, their jobs requeued from the checkpoint), then leave."""

    async def on_notice(notice: Notice) -> None:
        node_id = agent.node.node_id
        await agent.publish_reliably(
            NodeInterrupted(
                event_id=f"{node_id}:{agent.boot_id}:interrupted",
                node_id=node_id,
                kind=notice.kind,
                action=notice.action,
                notice_time=notice.time,
            )
        )
        await agent.shutdown(reason=f"spot {notice.kind}: {notice.action} at {notice.time}")
        exit_process()

    return on_notice
