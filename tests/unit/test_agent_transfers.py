"""Storage copies on threads of their own: a project holds at most `PER_PROJECT` of them however many of its copies
wait (another project's go on), and a copy whose awaiter was cancelled keeps its places until its thread ends."""

import asyncio
import threading

from services.agent import transfers


async def test_a_project_whose_storage_hangs_holds_its_own_places_not_another_projects():
    hung, running = threading.Event(), []

    def stuck(name: str) -> str:
        running.append(name)
        hung.wait(10)
        return name

    theirs = [asyncio.create_task(transfers.transfer(lambda i=i: stuck(f"a{i}"), project="a")) for i in range(4)]
    try:
        mine = await asyncio.wait_for(transfers.transfer(lambda: "b", project="b"), 5)
        assert mine == "b" and sorted(running) == ["a0", "a1"]  # two of a's at once, the others wait
    finally:
        hung.set()
    assert sorted(await asyncio.gather(*theirs)) == ["a0", "a1", "a2", "a3"]
    assert "a" not in transfers._SLOTS and "b" not in transfers._SLOTS  # nothing kept for projects at rest


async def test_a_cancelled_copy_keeps_its_task_lock_until_its_thread_ends():
    """A task's end cancels its periodic copies; its last copy must not run beside one still in its thread."""
    release, order = threading.Event(), []
    lock = asyncio.Lock()

    def slow() -> None:
        release.wait(10)
        order.append("periodic")

    periodic = asyncio.create_task(transfers.transfer(slow, project="p", lock=lock))
    await asyncio.sleep(0.1)
    periodic.cancel()
    last = asyncio.create_task(transfers.transfer(lambda: order.append("last"), project="p", lock=lock))
    await asyncio.sleep(0.2)
    assert order == [] and lock.locked()  # the last copy waits for the cancelled one's thread
    release.set()
    await last
    assert order == ["periodic", "last"] and periodic.cancelled()
