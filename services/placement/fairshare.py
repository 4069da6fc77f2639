"""Recent GPU-hours per user (halved every week) that order the queue fairly, kept across restarts."""

import asyncio
import math
import time
from dataclasses import dataclass, field

from pymongo.asynchronous.collection import AsyncCollection

HALF_LIFE_S = 7 * 86400.0
DOC_ID = "fair-share"
# A charge's key is kept this long (and at most this many, the newest), long past any redelivery of its event.
KEEP_KEYS_S = HALF_LIFE_S
MAX_KEYS = 10_000


@dataclass
class FairShare:
    """In memory it is authoritative (placement runs as one process); each charge is written through (as
    [user, hours] pairs: user names may hold characters a field name may not) with its key, so that a charge
    seen again (its write failed, or the event came back after a restart) adds nothing twice."""

    collection: AsyncCollection | None = None
    usage: dict[str, float] = field(default_factory=dict)
    at: float = field(default_factory=time.time)
    saving: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)  # jobs finish concurrently
    charged: dict[str, float] = field(default_factory=dict)  # charge key -> when it was added
    changes: int = field(default=0, repr=False)  # charges that added hours, in memory
    saved: int = field(default=0, repr=False)  # of those, how many the last write held

    def decayed(self, now: float) -> dict[str, float]:
        factor = 0.5 ** (max(0.0, now - self.at) / HALF_LIFE_S)
        return {user: hours * factor for user, hours in self.usage.items()}

    def decay(self, now: float) -> None:
        self.usage = {user: hours for user, hours in self.decayed(now).items() if hours >= 1e-6}
        self.at = max(self.at, now)

    async def charge(self, user: str, gpu_hours: float, *, key: str, now: float | None = None) -> None:
        """Add a finished job's GPU-hours once per `key` (its job id) and write them through; a key seen before
        only makes sure its charge is written. A charge of none (a job without GPUs) writes nothing: the decay
        since the stored moment is computed again from it after a restart."""
        now = time.time() if now is None else now
        self.decay(now)
        if not (math.isfinite(gpu_hours) and gpu_hours > 0):
            return
        if key not in self.charged:
            self.usage[user] = self.usage.get(user, 0.0) + gpu_hours
            self.charged[key] = now
            self.changes += 1
        await self.save()

    async def load(self) -> None:
        if self.collection is None:
            return
        doc = await self.collection.find_one({"_id": DOC_ID})
        if not doc:
            return
        pairs = doc.get("usage") if isinstance(doc.get("usage"), list) else []
        self.usage = {
            str(p[0]): float(p[1])
            for p in pairs
            if isinstance(p, list)
            and len(p) == 2
            and isinstance(p[1], int | float)
            and math.isfinite(p[1])
            and p[1] >= 0
        }
        at = doc.get("at")
        self.at = float(at) if isinstance(at, int | float) and math.isfinite(at) else time.time()
        keys = doc.get("charged") if isinstance(doc.get("charged"), list) else []
        self.charged = {
            str(k[0]): float(k[1])
            for k in keys
            if isinstance(k, list) and len(k) == 2 and isinstance(k[1], int | float) and math.isfinite(k[1])
        }

    async def save(self) -> None:
        """Write what is in memory now; one write at a time, each taking its picture once it has the lock, so the
        last write is of the latest state (two charges of jobs finishing together cannot land out of order). A
        charge whose hours a write taken after it already holds writes nothing more (charges that come together
        share one write)."""
        if self.collection is None:
            return
        wanted = self.changes
        async with self.saving:
            if wanted and self.saved >= wanted:
                return
            taken = self.changes
            self.charged = recent(self.charged, self.at)
            await self.collection.replace_one(
                {"_id": DOC_ID},
                {
                    "_id": DOC_ID,
                    "at": self.at,
                    "usage": [[u, h] for u, h in self.usage.items()],
                    "charged": [[k, t] for k, t in self.charged.items()],
                },
                upsert=True,
            )
            self.saved = taken


def recent(charged: dict[str, float], now: float) -> dict[str, float]:
    """The charge keys still kept at `now`: those of the last KEEP_KEYS_S, at most MAX_KEYS, newest first."""
    kept = sorted(((at, key) for key, at in charged.items() if at > now - KEEP_KEYS_S), reverse=True)[:MAX_KEYS]
    return {key: at for at, key in kept}
