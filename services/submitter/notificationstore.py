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

    async def webhook_url(self, project_id: str) -> str | None:
        return (await self.webhook(project_id))[0]

    async def webhook(self, project_id: str) -> tuple[str | None, str | None]:
        """The project's webhook URL and the secret its deliveries are signed with (None: none, or set before
        deliveries were signed)."""
        doc = await self.projects.find_one({"_id": project_id}) or {}
        return doc.get("webhook_url"), doc.get("webhook_secret")

    async def set_webhook(self, project_id: str, url: str | None, secret: str | None) -> None:
        await self.projects.update_one(
            {"_id": project_id}, {"$set": {"webhook_url": url, "webhook_secret": secret}}, upsert=True
        )
