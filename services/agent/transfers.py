"""Copies between a task's folders and storage (inputs, checkpoints, outputs) run on threads of their own:
`TRANSFER_THREADS` on a node, at most `PER_PROJECT` of them a project's, and one of a running task's at a time.

They used to run on the event loop's default pool, beside everything the agent does off its loop for every task
(a uid's claim and release, a cgroup, a chown, the disk measure): a storage that answered slowly, or a task with a
few outputs uploaded every second to one, held all of its threads, and every other project's task on the node
waited to start or to end (found by review). A project whose storage hangs now holds `PER_PROJECT` transfer threads
at most, however many of its tasks run; its own copies wait behind them, no other project's do.

A transfer holds its places until its thread ends, even when what awaited it is cancelled (a task's end cancels its
periodic copies): its thread cannot be stopped, and the next copy of the same folder (the last one, at the task's
end) must not run beside it from an older manifest.
"""

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import TypeVar

TRANSFER_THREADS = 16
PER_PROJECT = 2

T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=TRANSFER_THREADS, thread_name_prefix="transfer")
_SLOTS: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}  # project -> its places, and how many wait or hold one


async def transfer(call: Callable[[], T], *, project: str, lock: asyncio.Lock | None = None) -> T:
    """`call()` on a transfer thread, in one of `project`'s places (and holding `lock`, a task's, where given), both
    held until the thread ends."""
    slots, users = _SLOTS.setdefault(project, (asyncio.Semaphore(PER_PROJECT), [0]))
    users[0] += 1
    try:
        async with AsyncExitStack() as held:
            if lock is not None:
                await held.enter_async_context(lock)
            await held.enter_async_context(slots)
            future = asyncio.get_running_loop().run_in_executor(_POOL, call)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                await asyncio.wait([future])  # the copy goes on: its places stay taken until it ends
                raise
    finally:
        users[0] -= 1
        if not users[0]:  # none of the project's waits or holds a place: its semaphore goes
            del _SLOTS[project]
