"""Finished attempts' directories (`<agent dir>/jobs/<job>/attempt-<n>-rank-<r>`) on the node's disk: kept a while
to look into, within a budget, then removed.

An attempt's directory counts as finished once its end is reported: by then its output has gone to the stream
(every chunk acknowledged), its last checkpoint and its outputs to storage (a fenced one's deliberately not), and
the next attempt restores from storage, never from here. A restarted agent takes every directory its previous run
left as finished at its first sweep (the previous run's tasks died with it). Finished directories go after
`retention_s`, and the oldest first while they hold more than `budget_bytes` together. Sizes count what the
directory holds without following links (a link a task planted is removed, never what it points to).
"""

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from services.agent.quota import disk_usage, inode_share

log = logging.getLogger(__name__)

SWEEP_S = 60.0  # how often retention is looked at besides each end


@dataclass(frozen=True)
class Finished:
    path: Path
    ended_at: float  # the retention's clock
    size: int  # bytes


def to_remove(finished: Iterable[Finished], *, now: float, retention_s: float, budget_bytes: int) -> list[Finished]:
    """Those past their retention, and any larger than the whole budget, then the oldest of the rest until what is
    left fits the budget (one task's folder measured huge, a link farm or a tree too deep to measure, had every
    older job's folder removed before it; found by review)."""
    expired: list[Finished] = []
    kept: list[Finished] = []
    for f in sorted(finished, key=lambda f: f.ended_at):
        (expired if now - f.ended_at >= retention_s or f.size > budget_bytes else kept).append(f)
    total = sum(f.size for f in kept)
    while kept and total > budget_bytes:
        oldest = kept.pop(0)
        expired.append(oldest)
        total -= oldest.size
    return expired


def size_of(path: Path) -> int:
    """Disk used under `path`, as the task's quota counts it (allocated blocks: a sparse file is what it holds, not
    what it claims; each entry at least its share of the disk's inodes), links not followed; the directory itself
    too (an empty one is not free)."""
    try:
        own = os.lstat(path).st_blocks * 512
    except OSError:
        own = 0
    return max(own, 1) + disk_usage(str(path), floor=inode_share(str(path)))


def attempt_dirs(jobs: Path) -> list[Path]:
    """Every attempt directory under the agent's jobs directory (real directories only)."""
    if not jobs.is_dir():
        return []
    return [
        attempt
        for job in jobs.iterdir()
        if job.is_dir() and not job.is_symlink()
        for attempt in job.iterdir()
        if attempt.name.startswith("attempt-") and attempt.is_dir() and not attempt.is_symlink()
    ]


def remove_empty(job_dirs: Iterable[Path]) -> None:
    """Remove the job directories no attempt is left in. Call it from the agent's event loop, never from a thread:
    a launch makes the job's directory and then its attempt's in one step of the loop, so it never finds the job's
    directory gone between the two."""
    for job_dir in set(job_dirs):
        try:
            job_dir.rmdir()
        except OSError:  # an attempt of the job is still there
            pass


def remove_tree(path: Path) -> None:
    """A folder and everything in it, links removed as links, never followed; one deeper than Python's stack (a
    task's `mkdir d; cd d` a thousand times stopped every later sweep) by coreutils' `rm`."""
    try:
        shutil.rmtree(path)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=True, timeout=600)


@dataclass
class Retention:
    jobs: Path  # <agent dir>/jobs
    retention_s: float
    budget_bytes: int
    clock: Callable[[], float] = time.monotonic
    finished: dict[Path, Finished] = field(default_factory=dict)

    def ended(self, path: Path) -> None:
        """An attempt's end was reported: its directory is finished from now (blocking: measures it)."""
        if path.is_dir() and not path.is_symlink():
            self.finished[path] = Finished(path, self.clock(), size_of(path))

    def adopt(self, left: Iterable[Path]) -> None:
        """The attempt directories a previous run of the agent left (`attempt_dirs`, listed before this run made
        any) are finished now: their tasks died with it. Blocking (measures each): run it in a thread, after the
        agent registered (a long walk must not hold back its heartbeats)."""
        for path in left:
            if path not in self.finished:
                self.ended(path)

    def sweep(self) -> list[Path]:
        """Remove what retention and the budget no longer keep (blocking); the directories removed."""
        gone = to_remove(
            self.finished.values(), now=self.clock(), retention_s=self.retention_s, budget_bytes=self.budget_bytes
        )
        removed = []
        for f in gone:
            try:
                remove_tree(f.path)
            except FileNotFoundError:
                pass
            except (OSError, subprocess.SubprocessError) as exc:  # left for the next sweep; the others go on
                log.warning("finished attempt %s not removed: %r", f.path, exc)
                continue
            self.finished.pop(f.path, None)
            removed.append(f.path)
        return removed
