"""The queue view's entries as this process wrote them, counted per project and per user: what the queue caps count,
without a count on the database at each submission. It follows every write of the queue view as the database applies
it (versioned: an entry for an older status than the one kept is refused, whatever order they come in), and only
once the write is done, so it never counts fewer than the stored view; it is rebuilt with the view at the start."""

from collections import Counter
from dataclasses import dataclass, field

Owner = tuple[str, str]  # (project, user) of a job holding a place in the queue


@dataclass
class QueuedCounts:
    entries: dict[str, tuple[int, Owner | None, float]] = field(default_factory=dict)  # job -> (version, owner, when)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # ("project" | "user", name) -> queued jobs

    def reset(self, queued: list[tuple[str, int, Owner]]) -> None:
        """The view as rebuilt from the jobs: (job, status version, owner) of each job in the queue."""
        self.entries.clear()
        self.counts.clear()
        for job_id, version, owner in queued:
            self.put(job_id, version, owner, now=0.0)

    def put(self, job_id: str, version: int, owner: Owner | None, *, now: float, upsert: bool = True) -> None:
        """The job's entry written for status `version`: holding `owner`'s place, or (None) a tombstone holding
        none; refused where one for a newer status is kept, and (not `upsert`) where the job has none."""
        kept = self.entries.get(job_id)
        if (kept is None and not upsert) or (kept is not None and kept[0] >= version):
            return
        self._count(kept[1] if kept else None, -1)
        self.entries[job_id] = (version, owner, now)
        self._count(owner, +1)

    def drop(self, job_id: str) -> None:
        """The job's entry deleted."""
        kept = self.entries.pop(job_id, None)
        self._count(kept[1] if kept else None, -1)

    def sweep(self, before: float) -> None:
        """Tombstones written before `before` deleted (as the view's sweep deletes them)."""
        for job_id in [j for j, (_, owner, when) in self.entries.items() if owner is None and when < before]:
            del self.entries[job_id]

    def count(self, *, project_id: str | None = None, user_name: str | None = None) -> int:
        return self.counts[("project", project_id)] if project_id else self.counts[("user", user_name or "")]

    def _count(self, owner: Owner | None, step: int) -> None:
        if owner is not None:
            self.counts[("project", owner[0])] += step
            self.counts[("user", owner[1])] += step
