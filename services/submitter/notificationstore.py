"""api_notifications and api_projects: notifications kept for delivery, and where each project's go. The only door
to those collections (`notifications` delivers through it)."""

import asyncio
from dataclasses import dataclass, field
from typing import Any

from pymongo import DESCENDING
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError

from shared.events import Notification


@dataclass
class NotificationStore:
    notifications: AsyncCollection  # api_notifications: one document per notification, with its delivery state
    projects: AsyncCollection  # api_projects: each project's settings (its webhook URL and signing secret)
    recorded: asyncio.Event = field(default_factory=asyncio.Event, repr=False)  # set by each one this process keeps

    async def record(self, event: Notification) -> None:
        """Keep a notification once (a redelivered event adds nothing) for the delivery loop."""
        try:
            await self.notifications.insert_one(
                {
                    "_id": event.event_id,
                    "project_id": event.project_id,
                    "job_id": event.job_id,
                    "user_name": event.user_name,
                    "kind": event.kind,
                    "message": event.message,
                    "created_at": event.occurred_at,
                    "state": "pending",
                    "attempts": 0,
                    "next_try": 0.0,
                    "error": "",
                }
            )
        except DuplicateKeyError:
            return
        self.recorded.set()

    async def due(self, now: float) -> list[dict[str, Any]]:
        """Notifications waiting for delivery whose next try has come."""
        return [d async for d in self.notifications.find({"state": "pending", "next_try": {"$lte": now}})]

    async def claim(self, doc: dict[str, Any], *, until: float) -> bool:
        """Move a due notification's next try to `until`, unless another replica moved it first (then False)."""
        taken = await self.notifications.update_one(
            {"_id": doc["_id"], "state": "pending", "next_try": doc["next_try"]}, {"$set": {"next_try": until}}
        )
        return taken.modified_count == 1

    async def tried(self, notification_id: str, update: dict[str, Any]) -> None:
        """What a delivery try left: its state, attempts, error, next try."""
        await self.notifications.update_one({"_id": notification_id}, {"$set": update})

    async def recent(self, project_id: str, *, limit: int) -> list[dict[str, Any]]:
        """The project's latest notifications, newest first."""
        cursor = self.notifications.find({"project_id": project_id}).sort("created_at", DESCENDING).limit(limit)
        return [d async for d in cursor]

    async def webhook(self, project_id: str) -> "Webhook":
        """The project's webhook: its URL and the secrets its deliveries are signed with."""
        doc = await self.projects.find_one({"_id": project_id}) or {}
        return Webhook(
            url=doc.get("webhook_url"),
            secret=doc.get("webhook_secret"),
            previous=doc.get("webhook_secret_previous"),
            previous_until=doc.get("webhook_secret_previous_until") or 0.0,
        )

    async def clear(self, project_id: str) -> None:
        """No webhook: its URL and every secret dropped."""
        await self.projects.update_one(
            {"_id": project_id},
            {"$set": {"webhook_url": None, "webhook_secret": None, "webhook_secret_previous": None}},
            upsert=True,
        )

    async def point(
        self, project_id: str, url: str, *, expected: str | None, secret: "NewSecret | None" = None
    ) -> bool:
        """Point the webhook at `url`, and sign with `secret` from now on where one is given, in one write, unless
        the secret is no longer `expected` (another request replaced or dropped it first: then False, nothing
        written, so a new secret is never shown unless kept, and a new URL never signed with a secret read before
        another request changed it)."""
        fields: dict[str, Any] = {"webhook_url": url}
        if secret is not None:
            fields |= {
                "webhook_secret": secret.secret,
                "webhook_secret_previous": secret.previous,
                "webhook_secret_previous_until": secret.previous_until,
            }
        try:
            done = await self.projects.update_one(
                {"_id": project_id, "webhook_secret": expected}, {"$set": fields}, upsert=True
            )
        except DuplicateKeyError:  # the project's settings exist, with another secret
            return False
        return done.matched_count == 1 or done.upserted_id is not None


@dataclass(frozen=True)
class NewSecret:
    secret: str
    previous: str | None  # the secret it replaces, still signing until `previous_until` (a rotation's overlap)
    previous_until: float


@dataclass(frozen=True)
class Webhook:
    url: str | None
    secret: str | None  # None: none made yet (a webhook set before deliveries were signed)
    previous: str | None  # the secret a rotation replaced, still signing until `previous_until` (Unix seconds)
    previous_until: float

    def secrets(self, now: float) -> list[str]:
        """The secrets a delivery now is signed with: the current one, and the one it replaced while that overlaps."""
        return [s for s in (self.secret, self.previous if now < self.previous_until else None) if s]
