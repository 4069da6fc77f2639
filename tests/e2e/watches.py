"""Jobs the ETA tests watch in real time: a replay's pace or a bar's pauses, a minute of mostly waiting each.

A test asks for its watch with `@pytest.mark.watched(name)` and the session's `watches` fixture; every watch the
session holds starts at once, in a thread and an event loop of their own, the first time the fixture is set up. Their
tests share one pytest-xdist group (tests/conftest.py) with a test that only runs beside them (the README's, which
computes while they wait): it goes first, so the worker runs it while the watched jobs run, and the tier waits for
them once, not once each and not on top of it. Each test then awaits its watch's result and checks it itself."""

import asyncio
import concurrent.futures
import contextlib
import threading
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from services.stack.processes import Stack
from tests.conftest import admin_client

Watch = Callable[[httpx.AsyncClient, Stack], Awaitable[Any]]
WATCHES: dict[str, Watch] = {}
JOIN_S = 10.0  # how long a cancel waits for the watches' thread to end


def watch(name: str) -> Callable[[Watch], Watch]:
    """Register `name`'s watch: it submits its job through the client given and returns what its test checks."""

    def register(fn: Watch) -> Watch:
        WATCHES[name] = fn
        return fn

    return register


class Watches:
    """The watches `names`, started together against `stack` in a thread of their own."""

    def __init__(self, stack: Stack, names: list[str]) -> None:
        self.futures: dict[str, concurrent.futures.Future] = {name: concurrent.futures.Future() for name in names}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: list[asyncio.Task] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._all(stack),), name="watches", daemon=True)
        self.thread.start()
        if not self.started.wait(timeout=30):
            raise RuntimeError("the watches did not start in 30 s")

    async def _all(self, stack: Stack) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            async with admin_client(stack, timeout=60) as api:
                self.tasks = [asyncio.create_task(self._one(api, stack, name)) for name in self.futures]
                self.started.set()
                await asyncio.gather(*self.tasks, return_exceptions=True)
        except BaseException as exc:  # the watches could not run: every test waiting for one fails with why
            for future in self.futures.values():
                if not future.done():
                    future.set_exception(exc)
            self.started.set()
            raise

    async def _one(self, api: httpx.AsyncClient, stack: Stack, name: str) -> None:
        future = self.futures[name]
        try:
            future.set_result(await WATCHES[name](api, stack))
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:  # the test asking for it fails with it
            if not future.done():  # its test may have given up on it (cancelled) meanwhile
                future.set_exception(exc)

    async def result(self, name: str) -> Any:
        """What the watch `name` returned (it raised: that). A test that gives up waiting (its timeout) leaves the
        watch's own result alone."""
        return await asyncio.shield(asyncio.wrap_future(self.futures[name]))

    def cancel(self) -> None:
        for task in self.tasks:
            with contextlib.suppress(RuntimeError):  # the loop is closed: every watch ended
                self.loop.call_soon_threadsafe(task.cancel)  # type: ignore[union-attr]
        self.thread.join(timeout=JOIN_S)
        if self.thread.is_alive():  # a watch that ignores its cancellation: said, not left to hang unseen
            stuck = [name for name, future in self.futures.items() if not future.done()]
            warnings.warn(f"watches still running {JOIN_S:.0f} s after they were cancelled: {stuck}", stacklevel=2)
