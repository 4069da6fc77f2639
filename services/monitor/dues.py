"""When the monitor's sweeps can find anything: a running job past its deadline or an exit kept for a start that did
not come (`service.due_query`), a job suspected hung (`hangs.restart_overdue`). Each sweep is a query, once a second,
that the embedded database answers by reading every job; at rest, and in a burst of short jobs, it finds nothing.

The monitor and its outbox relay are its jobs' only writers, so every state that can become due passes through this
process (`Monitor.apply`): each state about to be written says when it could be due, counted at once, whether or not
its write lands. The due sweep runs only once that moment has come, and then also asks the database when the next
stored job is due; what was written while it read (or is still being written) counts beside its answer. The hang
sweep runs while a job may be hanging. At start nothing is known (an earlier process wrote the jobs): both run.

A write this process did not make (a deposed leader's last one, landing after this leader's first sweep read) passes
by it: each sweep therefore also runs at least once a minute (`LOOK_ANYWAY`), whatever this process knows, as the
fence looks at every stored job every 30 s.
"""

import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shared.jobs import Phase, SecondaryPhase
from services.monitor.state import JobState

UNKNOWN = datetime.min.replace(tzinfo=UTC)  # due already: the sweep runs and learns
LOOK_ANYWAY = timedelta(seconds=60)  # each sweep reads at least this often (writes of another process)


def due_at(job: JobState) -> datetime | None:
    """The earliest moment the due sweep may act on the job: its deadline while it runs, its first exit kept for a
    start, a stop no exit answered; None for none."""
    deadline = job.deadline if job.phase == Phase.RUNNING else None
    times = [t for t in (deadline, job.exits_due, job.stop_due) if t is not None]
    return min(times) if times else None


def hanging(job: JobState) -> bool:
    return job.phase == Phase.RUNNING and job.secondary_phase == SecondaryPhase.HANGING


def earliest(*times: datetime | None) -> datetime | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


@dataclass
class Dues:
    """The earliest moment a job may be due (None: none may be until a state that can is written), and whether a
    job may be hanging, from what this process wrote and what its sweeps read."""

    next_due: datetime | None = UNKNOWN
    may_hang: bool = True
    _writes: "itertools.count[int]" = field(default_factory=itertools.count, repr=False)
    _in_flight: dict[int, tuple[datetime | None, bool]] = field(default_factory=dict, repr=False)  # write -> its dues
    _ended_due: datetime | None = None  # the dues of the writes that ended since the due sweep began reading
    _ended_hanging: bool = False  # ... and whether one of those since the hang sweep began was hanging
    _due_look: datetime = UNKNOWN  # when the due sweep reads anyway (a write of another process)
    _hang_look: datetime = UNKNOWN  # ... and the hang sweep

    def begin(self) -> int:
        """One job's write begins (`writing` each state it may store, `end` once it is over, landed or not)."""
        token = next(self._writes)
        self._in_flight[token] = (None, False)
        return token

    def writing(self, token: int, job: JobState) -> None:
        """A state about to be written: counted now, whether or not its write lands."""
        at, hangs = due_at(job), hanging(job)
        self.next_due = earliest(self.next_due, at)
        self.may_hang = self.may_hang or hangs
        due, hung = self._in_flight.get(token, (None, False))
        self._in_flight[token] = (earliest(due, at), hung or hangs)

    def end(self, token: int) -> None:
        due, hung = self._in_flight.pop(token, (None, False))
        self._ended_due = earliest(self._ended_due, due)
        self._ended_hanging = self._ended_hanging or hung

    def due(self, now: datetime) -> bool:
        """Whether the due sweep may find a job now (or has not read for `LOOK_ANYWAY`)."""
        return (self.next_due is not None and self.next_due <= now) or self._due_look <= now

    def hang_due(self, now: datetime) -> bool:
        """Whether the hang sweep may find a job now (or has not read for `LOOK_ANYWAY`)."""
        return self.may_hang or self._hang_look <= now

    def due_sweep_begins(self, now: datetime) -> None:
        """The due sweep starts reading: a write that ended before is in what it reads."""
        self._ended_due = None
        self._due_look = now + LOOK_ANYWAY

    def due_swept(self, next_stored: datetime | None) -> None:
        """The due sweep read when the next stored job is due (None: none is); what was written meanwhile, or is
        still being written, counts beside it."""
        in_flight = (due for due, _ in self._in_flight.values())
        self.next_due = earliest(next_stored, self._ended_due, *in_flight)

    def hang_sweep_begins(self, now: datetime) -> None:
        self._ended_hanging = False
        self._hang_look = now + LOOK_ANYWAY

    def hang_swept(self, found: bool) -> None:
        """The hang sweep found jobs hanging (they stay suspect), or none."""
        in_flight = any(hung for _, hung in self._in_flight.values())
        self.may_hang = found or self._ended_hanging or in_flight
