"""Caps on jobs accepted but not yet running, per project and per user: counted on the repository's queue view."""

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from services.submitter.refusals import QueueFull

QUEUED_PHASES = ["Creating", "Pending"]  # accepted, not yet running


def queue_full(*, scope: str, name: str, queued: int, cap: int) -> QueueFull | None:
    """The refusal of one more queued job when `queued` already reached `cap`, else None."""
    return None if queued < cap else QueueFull(scope=scope, name=name, queued=queued, cap=cap)


# A count of the queue view is trusted this long, plus the places this process gave since (`Repository.queued_added`:
# they only grow, so jobs that left the queue meanwhile are still counted, never fewer than the view holds); past
# it, or where it would refuse, the view is counted again (jobs that left the queue are then let go). Another API
# replica's new jobs are not in it: what several replicas may overshoot a cap by is what the others accepted this
# long, at most. One submitter alone never overshoots: every place it gives is counted.
REMEMBER_S = 2.0

Key = tuple[str, str]  # ("project" | "user", name)


def _asked(key: Key) -> dict[str, str]:
    return {"project_id": key[1]} if key[0] == "project" else {"user_name": key[1]}


@dataclass
class QueueCaps:
    """Caps on jobs accepted but not yet running; the count and the insert are one step (the intake writes one
    group of new jobs at a time, counted by `admit_group`), the count read from the queue view at most every
    `REMEMBER_S` per project and user while it leaves room (a burst's every group counted it twice before)."""

    per_project: int
    per_user: int
    clock: Callable[[], float] = time.monotonic
    counted: dict[Key, tuple[int, int, float]] = field(default_factory=dict, repr=False)  # (count, added, when)

    async def check(self, repo, *, project_id: str, user_name: str) -> None:
        """Raise QueueFull when the project or the user already has its cap of queued jobs (`repo`: the
        submitter's Repository, whose queue holds one entry per job not yet running): an early check before a
        submission's RPCs; the intake checks again before storing."""
        [refusal] = await self.admit_group(repo, [(project_id, user_name)])
        if refusal is not None:
            raise refusal

    def _cap(self, key: Key) -> int:
        return self.per_project if key[0] == "project" else self.per_user

    def _remembered(self, repo, key: Key, *, now: float) -> int | None:
        """The queued jobs of `key` as last counted plus the places given here since, while fresh; else None."""
        count, added, at = self.counted.get(key, (0, 0, -math.inf))
        if not 0 <= now - at < REMEMBER_S:
            return None
        return count + repo.queued_added(**_asked(key)) - added

    async def admit_group(self, repo, owners: list[tuple[str, str]]) -> list[QueueFull | None]:
        """For new jobs of (project, user), in arrival order: None for one that may be queued, else its refusal;
        each one admitted counts against those after it. A project or user is counted on the queue view unless
        its remembered count leaves room for all of the group's jobs."""
        asked = Counter([("project", p) for p, _ in owners] + [("user", u) for _, u in owners])
        now = self.clock()
        queued = {key: self._remembered(repo, key, now=now) for key in asked}
        recount = sorted(k for k, n in queued.items() if n is None or n + asked[k] > self._cap(k))
        if len(self.counted) > 10_000:  # projects and users of long ago
            self.counted.clear()
        added = [repo.queued_added(**_asked(key)) for key in recount]  # before the count: a place given meanwhile
        counts = await asyncio.gather(*(repo.queued_count(**_asked(key)) for key in recount))  # is counted twice
        for key, count, given in zip(recount, counts, added):
            queued[key] = count
            self.counted[key] = (count, given, now)
        known: dict[Key, int] = {key: n for key, n in queued.items() if n is not None}
        answers: list[QueueFull | None] = []
        for project_id, user_name in owners:
            refusal = queue_full(
                scope="project", name=project_id, cap=self.per_project, queued=known[("project", project_id)]
            ) or queue_full(scope="user", name=user_name, cap=self.per_user, queued=known[("user", user_name)])
            if refusal is None:
                known[("project", project_id)] += 1
                known[("user", user_name)] += 1
            answers.append(refusal)
        return answers
