"""Caps on jobs accepted but not yet running, per project and per user: counted on the repository's queue view."""

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.submitter.refusals import QueueFull

QUEUED_PHASES = ["Creating", "Pending"]  # accepted, not yet running


def queue_full(*, scope: str, name: str, queued: int, cap: int) -> QueueFull | None:
    """The refusal of one more queued job when `queued` already reached `cap`, else None."""
    return None if queued < cap else QueueFull(scope=scope, name=name, queued=queued, cap=cap)


# The early check before a submission's RPCs lets a job on without counting when the intake counted its project and
# user this recently with room left: the intake counts again, under its lock, before storing (two reads a job in a
# burst saved). A full count is never trusted from memory: the queue may have drained since, so it is read again.
REMEMBER_S = 2.0


@dataclass
class QueueCaps:
    """Caps on jobs accepted but not yet running; the count and the insert are one step (one submitter: its
    intake writes one group of new jobs at a time, counted by `admit_group`)."""

    per_project: int
    per_user: int
    clock: Callable[[], float] = time.monotonic
    counted: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict, repr=False)  # (count, when)

    async def check(self, repo, *, project_id: str, user_name: str) -> None:
        """Raise QueueFull when the project or the user already has its cap of queued jobs (`repo`: the
        submitter's Repository, whose queue holds one entry per job not yet running); an early check, answered
        from the intake's last counts while they are fresh and leave room."""
        if self._room_counted(project_id, user_name):
            return
        [refusal] = await self.admit_group(repo, [(project_id, user_name)])
        if refusal is not None:
            raise refusal

    def _room_counted(self, project_id: str, user_name: str) -> bool:
        now = self.clock()
        for key, cap in ((("project", project_id), self.per_project), (("user", user_name), self.per_user)):
            count, at = self.counted.get(key, (cap, -math.inf))
            if count >= cap or not 0 <= now - at < REMEMBER_S:
                return False
        return True

    async def admit_group(self, repo, owners: list[tuple[str, str]]) -> list[QueueFull | None]:
        """For new jobs of (project, user), in arrival order: None for one that may be queued, else its refusal;
        each one admitted counts against those after it. One count per project and per user of the group."""
        projects, users = sorted({p for p, _ in owners}), sorted({u for _, u in owners})
        counts = await asyncio.gather(
            *(repo.queued_count(project_id=p) for p in projects), *(repo.queued_count(user_name=u) for u in users)
        )
        queued = {("project", p): n for p, n in zip(projects, counts)}
        queued |= {("user", u): n for u, n in zip(users, counts[len(projects) :])}
        answers: list[QueueFull | None] = []
        for project_id, user_name in owners:
            refusal = queue_full(
                scope="project", name=project_id, cap=self.per_project, queued=queued[("project", project_id)]
            ) or queue_full(scope="user", name=user_name, cap=self.per_user, queued=queued[("user", user_name)])
            if refusal is None:
                queued[("project", project_id)] += 1
                queued[("user", user_name)] += 1
            answers.append(refusal)
        now = self.clock()
        if len(self.counted) > 10_000:  # projects and users of long ago
            self.counted.clear()
        self.counted.update({key: (count, now) for key, count in queued.items()})
        return answers
