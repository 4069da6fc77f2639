"""New jobs stored and announced in groups (`shared.batch.GroupCommit`): during a burst, the jobs that arrive while
one group is written go out together as the next, its caps counted once per project and user, its jobs, queue
entries and list entries written in one command each, their announcements published side by side and pulled off
their outboxes in one write. Before, each job took five round trips to the database under one lock, and a burst
was accepted no faster than those round trips (about 8 jobs a second on the 2-core VM)."""

from dataclasses import dataclass
from typing import Any

from shared.batch import GroupCommit
from shared.events import JobSubmitted
from services.submitter.caps import QueueCaps
from services.submitter.refusals import NameTaken
from services.submitter.repository import Repository

MAX_GROUP = 256  # jobs per group: one insert's worth, far below any command size limit


@dataclass
class Arrival:
    doc: dict[str, Any]
    event: JobSubmitted


class Intake:
    def __init__(self, repo: Repository, caps: QueueCaps, *, max_group: int = MAX_GROUP) -> None:
        self.repo, self.caps = repo, caps
        # Arrival → outbox entries; QueueFull, NameTaken
        self.store: GroupCommit[Arrival, list[dict[str, Any]]] = GroupCommit(self._store, max_size=max_group)
        # (job id, entries) → None
        self.announce: GroupCommit[tuple[str, list[dict[str, Any]]], None] = GroupCommit(
            self._announce, max_size=max_group
        )

    async def _store(self, group: list[Arrival]) -> list[list[dict[str, Any]] | Exception]:
        """Counted and stored in one step (one group at a time): a burst cannot overshoot the caps. A job whose
        name turns out taken did not use its place under the caps: those refused for want of one are counted
        again (and stored if they now fit), as they would have been had they come one at a time."""
        answers: dict[int, list[dict[str, Any]] | Exception] = {}  # by the job's place in the group
        waiting = list(range(len(group)))
        while waiting:
            refusals = await self.caps.admit_group(
                self.repo, [(group[i].doc["project_id"], group[i].doc["user_name"]) for i in waiting]
            )
            admitted = [i for i, refusal in zip(waiting, refusals) if refusal is None]
            for i, refusal in zip(waiting, refusals):
                if refusal is not None:
                    answers[i] = refusal
            stored = await self.repo.insert_many([(group[i].doc, group[i].event) for i in admitted]) if admitted else []
            for i, entries in zip(admitted, stored):
                answers[i] = entries
            taken = any(isinstance(entries, NameTaken) for entries in stored)
            waiting = [i for i in waiting if i not in admitted] if taken else []
        return [answers[i] for i in range(len(group))]

    async def _announce(self, group: list[tuple[str, list[dict[str, Any]]]]) -> list[Exception | None]:
        return await self.repo.publish_many(group)
