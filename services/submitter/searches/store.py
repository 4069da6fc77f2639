"""api_searches: one document per search (its spec, trials and phase), replaced whole under a version check
(the embedded database stores a `$push`ed document or a `$set` datetime as text)."""

from dataclasses import dataclass
from typing import Any

from pymongo import DESCENDING
from pymongo.errors import DuplicateKeyError


class SearchNameTaken(Exception):
    """Another search of the project has this name."""


class Conflict(Exception):
    """The search changed since it was read (the stop action, or another writer)."""


@dataclass
class SearchStore:
    collection: Any
    max_running_per_project: int = 20  # SubmitterSettings.max_running_searches_per_project
    inserted: int = 0  # searches this process stored since it started (the driver reads at once after one)

    async def create_indexes(self) -> None:
        await self.collection.create_index([("project_id", 1), ("name", 1)], unique=True)
        await self.collection.create_index([("phase", 1)])

    async def insert(self, doc: dict[str, Any]) -> None:
        if await self.collection.find_one({"project_id": doc["project_id"], "name": doc["name"]}, {"_id": 1}):
            raise SearchNameTaken(doc["name"])  # the unique index decides a race
        try:
            await self.collection.insert_one({**doc, "version": 0})
        except DuplicateKeyError as exc:
            raise SearchNameTaken(doc["name"]) from exc
        self.inserted += 1

    async def get(self, project_id: str, search_id: str) -> dict[str, Any] | None:
        return await self.collection.find_one({"_id": search_id, "project_id": project_id})

    async def page(self, project_id: str, *, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
        query = {"project_id": project_id}
        total = await self.collection.count_documents(query)
        cursor = self.collection.find(query).sort([("create_time", DESCENDING), ("_id", DESCENDING)])
        return total, [d async for d in cursor.skip(offset).limit(limit)]

    async def running_in(self, project_id: str) -> int:
        return await self.collection.count_documents({"project_id": project_id, "phase": "Running"})

    async def running(self) -> list[dict[str, Any]]:
        return [d async for d in self.collection.find({"phase": "Running"})]

    async def save(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Replace the search if nobody changed it since it was read; the stored document comes back."""
        version = doc["version"]
        fresh = {**doc, "version": version + 1}
        result = await self.collection.replace_one({"_id": doc["_id"], "version": version}, fresh)
        if not result.matched_count:
            raise Conflict(doc["_id"])
        return fresh

    async def request_stop(self, project_id: str, search_id: str, *, by: str) -> bool:
        result = await self.collection.update_one(
            {"_id": search_id, "project_id": project_id, "phase": "Running"},
            {"$set": {"stop_requested": by}, "$inc": {"version": 1}},
        )
        return bool(result.matched_count)
