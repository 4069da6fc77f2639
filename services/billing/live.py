"""What billing holds in memory of the attempts' lines, for reports that a close landing mid-report neither loses
nor counts twice.

A usage report reads the ledger in several queries, with awaits between them, and the open lines from memory. An
attempt closing meanwhile used to be counted in neither (its line gone from memory, closed in the ledger after the
query that would have summed it) or in both. So every closed line carries a stamp (`tc`, increasing, drawn when its
write begins) and a report sums from the ledger only the lines stamped before its cutoff: the oldest write still
under way, or the report's own stamp where none is. Every line at or past the cutoff is in memory when the report
starts (its write under way, or landed since the oldest one under way began), and the report takes those from
here, with the lines still open, all in one synchronous look (`snapshot`): one instant, whatever lands later.

A write that raised may have landed (its answer lost) or not: its line stays in memory, in doubt, read as closed and
holding the cutoff at its stamp, so the ledger's copy (if any: the same stamp) is not summed as well, until its retry
writes it again under the same stamp or the ledger is read to settle it (`settle`).
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from services.billing.ledger import STAMP


@dataclass(frozen=True)
class Snapshot:
    """The lines a report reads from memory, and the cutoff of those it reads from the ledger."""

    cutoff: float  # the ledger's closed lines stamped before this are summed there; the others are `closed`
    running: list[dict[str, Any]]  # open lines, their close not begun
    closed: list[dict[str, Any]]  # closed lines stamped at or past the cutoff: written, or being written


@dataclass
class Write:
    """A closed line being written; `refused`: the ledger kept the line stored under its id before."""

    line: dict[str, Any]
    refused: bool = False
    again: bool = False  # the line was in doubt: its earlier write, under the same stamp, may be what refused it


@dataclass
class LiveLines:
    """The open lines (shared with `Attempts.running`), the closed lines being written, and those written since
    the oldest write under way began."""

    running: dict[str, dict[str, Any]] = field(default_factory=dict)
    writing: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    landed: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    doubt: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)  # their write raised: landed or not
    last: float = 0.0  # the latest stamp drawn (at the start: the ledger's latest, `resume`)
    # Counts the writes of closed lines begun here (and anything else that changes the closed lines the ledger
    # sums): while it stands still and nothing is being written, the ledger's sums are what they were (`Reports`).
    generation: int = 0

    def stamp(self) -> float:
        """A stamp later than every one drawn before, here or (after `resume`) by an earlier leader."""
        self.last = max(time.time(), self.last + 1e-6)
        return self.last

    def resume(self, latest: float | None) -> None:
        """At the start: stamps go on from the ledger's latest (a leader whose clock is behind stays after it)."""
        self.last = max(self.last, latest or 0.0)

    @contextmanager
    def closing(self, line: dict[str, Any]) -> Iterator["Write"]:
        """The closed line, stamped, while its write is under way; kept for reports once the block ends without
        error and with the write not `refused` (a line stored before stands, stamped as it was). Where the block
        raised, the line is kept in doubt (it may have landed); a line in doubt written again keeps its stamp, so
        the ledger never holds two stamps of one line."""
        key = line["_id"]
        self.generation += 1
        doubted = self.doubt.pop(key, None)
        write = Write(line={**line, STAMP: doubted[STAMP] if doubted else self.stamp()}, again=doubted is not None)
        self.writing[key] = write.line
        try:
            yield write
            if not write.refused:
                self.landed[key] = write.line
        except BaseException:
            self.doubt[key] = write.line
            raise
        finally:
            self.writing.pop(key, None)
            self._prune()

    def settle(self, key: str, stored: dict[str, Any] | None) -> bool:
        """A line in doubt settled by what the ledger holds under its id (`stored`, read since it went into doubt):
        True where its write landed (kept as written; the caller forgets it as open), False where not (open
        again here: its end is retried, or reconciled)."""
        line = self.doubt.pop(key, None)
        if line is None:
            return False
        landed = stored is not None and stored.get(STAMP) == line[STAMP]
        if landed:
            self.landed[key] = line
        self._prune()
        return landed

    def snapshot(self) -> Snapshot:
        """One instant's lines (no await: nothing changes while it is taken)."""
        cutoff = self._floor()
        if cutoff is None:
            cutoff = self.stamp()  # any close begun after this is stamped later: summed from memory, as running
        closed = [
            *self.writing.values(),
            *self.doubt.values(),
            *(line for line in self.landed.values() if line[STAMP] >= cutoff),
        ]
        running = [line for key, line in self.running.items() if key not in self.writing and key not in self.doubt]
        return Snapshot(cutoff=cutoff, running=running, closed=closed)

    def _prune(self) -> None:
        """Forget the written lines stamped before the oldest write under way (all of them where none is): every
        later cutoff is at or past that, so the ledger has them for every later report."""
        floor = self._floor()
        if floor is None:
            self.landed.clear()
        else:
            self.landed = {k: line for k, line in self.landed.items() if line[STAMP] >= floor}

    def _floor(self) -> float | None:
        """The oldest stamp of a write under way or in doubt: the ledger may hold those lines, or not yet."""
        return min((line[STAMP] for line in (*self.writing.values(), *self.doubt.values())), default=None)
