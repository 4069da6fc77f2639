"""Copies between a task's folders and storage (inputs, checkpoints, outputs) run on threads of their own:
`TRANSFER_THREADS` on a node, at most `PER_PROJECT` of them a project's, and one of a running task's at a time.

They used to run on the event loop's default pool, beside everything the agent does off its loop for every task
(a uid's claim and release, a cgroup, a chown, the disk measure): a storage that answered slowly, or a task with a
few outputs uploaded every second to one, held all of its threads, and every other project's task on the node
waited to start or to end (found by review). A project whose storage hangs now holds `PER_PROJECT` transfer threads
at most, however many of its tasks run; its own copies wait behind them, no other project's do.

A transfer holds its places until its thread ends, even when what awaited it is cancelled (a task's end cancels its
periodic copies): its thread cannot be stopped, and the next copy of the same folder (the last one, at the task's
end) must not run beside it from an older manifest. The cancelled awaiter does not wait for that thread: the places
are given back when it ends.

A storage that hangs (an NFS server gone, an object store that accepts a connection and never answers) would hold a
task's end for ever: its last copies are awaited before its end is reported. A copy says when bytes move (`moved`,
for each chunk and each file, on every thread the copy uses); `unless_stalled` gives up on copies that moved
nothing for `STALL_S`, so the task's end is reported, its folders named unsaved. What is judged is the copy's own
movement once it runs, and while it waits for one of its project's places, the movement of the project's copies
that hold them (a healthy project copying an hour of inputs is not a stall); a copy queued for a thread of the node
is never judged. A copy given up is abandoned: it is not started if it had not, and one still in its thread stops
at its next chunk, file or rename (`moved` raises), so it writes nothing after the end it was given up for is
reported (a next attempt may write the same names). Its thread keeps its places until it ends.
"""

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

TRANSFER_THREADS = 16
PER_PROJECT = 2
STALL_S = 600.0  # a task's last copies that moved no byte this long are given up (their storage hangs)
LOOK_S = 5.0  # how often a wait on copies looks at their progress (at most)

T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=TRANSFER_THREADS, thread_name_prefix="transfer")
_MOVING = threading.local()  # on a transfer thread: the `Progress` objects of the copy it runs


class Stalled(Exception):
    """Copies whose storage moved nothing for `STALL_S`: given up, and abandoned (no OSError: a copy's handling of
    a refused file must not take it for one and go on)."""


class Progress:
    """When the copies counted on it last moved a byte (or one of them began), and where the copy awaited now is:
    waiting for its task's turn or running (judged by its own movement), for one of its project's places (judged
    by the project's), or for a thread of the node (not judged)."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.abandoned = False
        self.queued = False  # submitted to the node's threads, not begun
        self.project: Project | None = None  # while it waits for one of this project's places

    def moved(self) -> None:
        if self.abandoned:
            raise Stalled("given up: its storage moved nothing for too long")
        self.last = time.monotonic()

    def idle_s(self) -> float:
        """How long the copy awaited now has been judged idle: its own movement; while it waits for a thread, the
        node's copies' too (busy threads that move are no stall; threads all held by hung copies are); while it
        waits for a place, the movement of the project's copies that hold them (judged alike where they wait for
        a thread)."""
        own = time.monotonic() - self.last
        if self.queued:
            return min(own, NODE.idle_s())
        if self.project is not None:
            holders = self.project.progress.idle_s()
            if self.project.waiting_for_a_thread():
                holders = min(holders, NODE.idle_s())
            return min(own, holders)
        return own


@dataclass
class Project:
    """One project's copies: its places, how many of its copies wait for or hold one, those that hold one, and
    when any of them last moved."""

    places: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PER_PROJECT))
    users: int = 0
    holders: set[Progress] = field(default_factory=set)
    progress: Progress = field(default_factory=Progress)

    def waiting_for_a_thread(self) -> bool:
        return any(holder.queued for holder in self.holders)


_SLOTS: dict[str, Project] = {}  # project -> its copies, while one waits for or holds a place
NODE = Progress()  # when any copy of the node last moved


def moved() -> None:
    """Said by a copy as bytes move (each chunk, each file), and before each rename or removal: its task's and its
    project's copies are progressing. Raises Stalled where the copy was given up (nothing where the copy runs
    outside `transfer`)."""
    for progress in getattr(_MOVING, "progress", ()):
        progress.moved()


def counted() -> tuple[Progress, ...]:
    """The progress the copy running on this thread counts on (for another thread of its own: fsspec's)."""
    return tuple(getattr(_MOVING, "progress", ()))


async def transfer(
    call: Callable[[], T], *, project: str, lock: asyncio.Lock | None = None, progress: Progress | None = None
) -> T:
    """`call()` on a transfer thread, in one of `project`'s places (and holding `lock`, a task's, where given), both
    held until the thread ends; what it moves counted on `progress` and on the project's."""
    copies = _SLOTS.setdefault(project, Project())
    copies.users += 1
    held: list[Callable[[], object]] = []  # what to give back once the copy's thread ends
    mine = progress or Progress()
    holding = False  # whether this call holds a place (a task's copies share their progress: only its own state)

    def give_back(*_: object) -> None:
        if holding:
            mine.queued = False
            copies.holders.discard(mine)
        for release in reversed(held):
            release()
        copies.users -= 1
        if not copies.users:  # none of the project's waits or holds a place
            del _SLOTS[project]

    try:
        if lock is not None:
            await lock.acquire()
            held.append(lock.release)
        mine.project = copies
        try:
            await copies.places.acquire()
        finally:
            mine.project = None
        held.append(copies.places.release)
        holding = True
        mine.last = time.monotonic()  # queued from now (judged by the node's movement as well: `idle_s`)
        mine.queued = True
        copies.holders.add(mine)
        future = asyncio.get_running_loop().run_in_executor(_POOL, _counted, call, mine, copies.progress)
    except BaseException:  # cancelled while waiting for a place (or no thread to be had): given back at once
        give_back()
        raise
    handed_over = False  # to the copy's thread: it gives them back when it ends
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if not future.done():  # the copy goes on: its places stay taken until its thread ends
            future.add_done_callback(_read_and(give_back))
            handed_over = True
        raise
    finally:
        if not handed_over:
            give_back()


def _read_and(give_back: Callable[[], None]) -> Callable[[asyncio.Future], None]:
    """A copy's end nobody awaits any more: its outcome read (an abandoned copy ends in Stalled, nothing to log),
    then its places given back."""

    def ended(future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()
        give_back()

    return ended


def _counted(call: Callable[[], T], progress: Progress, project: Progress) -> T:
    _MOVING.progress = (progress, project, NODE)
    try:
        try:
            moved()  # a copy that begins counts as moving (it may have waited for its thread); abandoned: not begun
        finally:
            progress.queued = False  # (after the movement: never judged idle in between; read on the loop)
        return call()
    finally:
        _MOVING.progress = ()


async def transfer_unless_stalled(call: Callable[[], T], *, project: str) -> T:
    """`transfer` of a copy counted on its own, given up (Stalled) once it moved nothing for `STALL_S`: a restore or a
    download at a task's start."""
    progress = Progress()
    return await unless_stalled(transfer(call, project=project, progress=progress), progress)


async def unless_stalled(work: Awaitable[T], progress: Progress, *, stall_s: float | None = None) -> T:
    """Await `work` (copies counted on `progress`) while they move (`Progress.idle_s`); once nothing moved for
    `stall_s` (`STALL_S`), `work` is cancelled, its copies abandoned (`progress`), and Stalled raised. The wait's
    own start counts as movement. Cancelled itself, it abandons them too."""
    stall_s = STALL_S if stall_s is None else stall_s
    progress.last = time.monotonic()
    waiting = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait([waiting], timeout=max(0.01, min(LOOK_S, stall_s - progress.idle_s())))
            if done:
                return waiting.result()
            if progress.idle_s() >= stall_s:
                progress.abandoned = True
                waiting.cancel()
                await asyncio.wait([waiting])
                if not waiting.cancelled() and waiting.exception() is None:  # it ended as it was given up
                    return waiting.result()
                raise Stalled(f"the task's copies moved nothing for {stall_s:g} s")
    except asyncio.CancelledError:
        progress.abandoned = True
        waiting.cancel()
        raise
