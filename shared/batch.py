"""Group commit: callers that arrive while a group is being written wait for the next group, written at once.

On the embedded database every command waits its turn under one lock, so a burst of small writes costs a round trip
each; written as a group (one `insert_many`, one `bulk_write`) a burst of N costs about what one caller costs. An
idle caller is written at once, alone: grouping adds no wait, it only collects who arrived during the last write.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# A group's write answers each item, in order: its result, or the exception that item alone raises.
GroupWrite = Callable[[list[T]], Awaitable[list[R | Exception]]]


class GroupCommit(Generic[T, R]):
    """`await commit(item)` returns the item's own result (or raises its own exception) once the group it went
    out with is written. One group at a time, in arrival order, at most `max_size` items each. A caller that
    stops waiting (cancelled) does not take its item back: what was handed over is written."""

    def __init__(self, write: GroupWrite, *, max_size: int = 256, window_s: float = 0.0) -> None:
        """window_s: a first caller waits this long for others before its group is written (0: written at once)."""
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.write, self.max_size, self.window_s = write, max_size, window_s
        self._waiting: list[tuple[T, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None
        self.groups = 0  # how many groups were written (for tests and benchmarks)

    async def __call__(self, item: T) -> R:
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        group: list[tuple[T, asyncio.Future]] = []
        try:
            if self.window_s > 0:
                await asyncio.sleep(self.window_s)
            while self._waiting:
                group = self._waiting[: self.max_size]
                del self._waiting[: self.max_size]
                try:
                    results = await self.write([item for item, _ in group])
                    if len(results) != len(group):
                        raise RuntimeError(f"a group write answered {len(results)} of {len(group)} items")
                except Exception as exc:  # the whole group failed alike (the database is away, say)
                    results = [exc] * len(group)
                self.groups += 1
                for (_, future), result in zip(group, results):
                    _settle(future, result)
                group = []
        except asyncio.CancelledError:  # shutdown (a write's own failure is its group's answer, above)
            for _, future in group + self._waiting:
                future.cancel()  # nobody is left waiting for ever
            self._waiting.clear()
            raise
        finally:
            self._writer = None


def _settle(future: asyncio.Future, result: object) -> None:
    if future.done():  # its caller stopped waiting
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
