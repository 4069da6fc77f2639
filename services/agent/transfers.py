"""Copies between a task's folders and storage (inputs, checkpoints, outputs) run on threads of their own, at most
`TRANSFER_THREADS` at once on a node and, while its attempt runs, one of a task's at a time.

They used to run on the event loop's default pool, beside everything the agent does off its loop for every task
(a uid's claim and release, a cgroup, a chown, the disk measure): a storage that answered slowly, or a task with a
few outputs uploaded every second to one, held all of its threads, and every other project's task on the node
waited to start or to end (found by review). A transfer stuck in its storage now holds a transfer thread, never a
start or an end."""

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

TRANSFER_THREADS = 4

P = ParamSpec("P")
T = TypeVar("T")

_POOL = ThreadPoolExecutor(max_workers=TRANSFER_THREADS, thread_name_prefix="transfer")


async def transfer(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on a transfer thread."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args, **kwargs))
