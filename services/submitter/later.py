"""Versioned view entries written a moment later: a job passes through phases that last less than a second (Pending,
Running of a short job), so the entry of a phase that does not end the job waits `delay_s`, and one of the same job
handed in meanwhile (or written at once: a phase that ends it) replaces it. What is still waiting then goes out in
one grouped write for all jobs; a write that fails leaves them waiting for the next. A graceful stop writes what
waits (`close`, for at most `STOP_WRITE_S`), and nothing after it whatever a write still under way then meets;
what a crash (or a stop the database does not answer in time) loses is rebuilt from the jobs at the next start, and
a job's next phase that ends it writes its entry at once whatever waited."""

import asyncio
import logging
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from shared.grouped import update_grouped

log = logging.getLogger(__name__)

STOP_WRITE_S = 5.0  # a stop waits this long for what waits to be written: past it, the next start rebuilds the views


def older_than(version: int) -> dict[str, Any]:
    """The filter of a view entry written for an older status than `version` (or before entries had versions)."""
    return {"$or": [{"v": {"$lt": version}}, {"v": {"$exists": False}}]}


class LaterWrites:
    """One collection's entries waiting to be written, the newest per job."""

    def __init__(self, collection: AsyncCollection, *, delay_s: float) -> None:
        self.collection, self.delay_s = collection, delay_s
        self.waiting: dict[str, tuple[int, dict[str, Any]]] = {}  # job id -> (status version, update)
        self._timer: asyncio.Task | None = None
        self._writing = asyncio.Lock()  # one write at a time: a stop waits for the one the timer started
        self.closed = False  # stopping: what is handed in (or put back by a failed write) waits for no timer

    def add(self, job_id: str, version: int, update: dict[str, Any]) -> None:
        """The job's entry for status `version`, written in `delay_s` unless a newer one replaces it first."""
        if job_id in self.waiting and self.waiting[job_id][0] >= version:
            return
        self.waiting[job_id] = (version, update)
        if self._timer is None and not self.closed:
            self._timer = asyncio.get_running_loop().create_task(self._later())

    def drop(self, job_id: str) -> None:
        """The job's entry is being written at once (for a newer status) or is gone: nothing waits for it."""
        self.waiting.pop(job_id, None)

    async def write_now(self) -> None:
        """What waits, written now (all in one grouped write), once a write already under way ended. Only entries
        that exist are updated: one of a job deleted meanwhile is not made again."""
        async with self._writing:
            batch, self.waiting = self.waiting, {}
            if not batch:
                return
            try:
                await update_grouped(
                    self.collection,
                    [({"_id": job_id, **older_than(v)}, update) for job_id, (v, update) in batch.items()],
                )
            except BaseException:  # failed or cut off (a stop's time out): waiting again (a newer entry handed in
                # meanwhile stands), tried again in `delay_s`
                for job_id, (version, update) in batch.items():
                    self.add(job_id, version, update)
                raise

    async def close(self, *, timeout_s: float = STOP_WRITE_S) -> None:
        """At a graceful stop (nothing is handed in any more): the write under way ended, then what waits (what it
        put back included) written now, for at most `timeout_s` in all. No timer starts after: the timer's write,
        still under way when the stop stopped waiting for it, puts back what fails and writes it no more."""
        self.closed = True
        self._stop_timer()
        try:
            await asyncio.wait_for(self.write_now(), timeout_s)
        except Exception as exc:  # the time out included: the next start rebuilds the views from the jobs
            log.warning("%d view entries not written to %s at stop: %r", len(self.waiting), self.collection.name, exc)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _later(self) -> None:
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self._timer = None
        try:
            await self.write_now()
        except Exception as exc:  # they wait again; a job's next phase writes its own, a restart rebuilds them all
            log.warning(
                "view entries not written to %s, tried again in %.1f s: %r", self.collection.name, self.delay_s, exc
            )
