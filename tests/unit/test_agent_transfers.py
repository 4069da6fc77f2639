"""Storage copies on threads of their own: a project holds at most `PER_PROJECT` of them however many of its copies
wait (another project's go on), and a copy whose awaiter was cancelled keeps its places until its thread ends."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

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


async def places_given_back(project: str) -> bool:
    for _ in range(200):  # bounded: a released thread ends at once
        if project not in transfers._SLOTS:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_copy_that_moves_nothing_is_given_up_and_abandoned_while_its_thread_keeps_its_places(monkeypatch):
    """The wait gives up (Stalled) once nothing moved for the stall time; the hung copy is abandoned (at its next
    chunk it stops, writing nothing more) and its places are given back only when its thread ends. A copy waiting
    for the place behind it is given up too: the place's holder moves nothing."""
    monkeypatch.setattr(transfers, "PER_PROJECT", 1)
    hung, wrote = threading.Event(), []
    progress = transfers.Progress()

    def copy() -> None:
        hung.wait(10)
        transfers.moved()  # its next chunk: given up meanwhile, it stops here
        wrote.append("after")

    try:
        with pytest.raises(transfers.Stalled):
            await asyncio.wait_for(
                transfers.unless_stalled(transfers.transfer(copy, project="s", progress=progress), progress, stall_s=1),
                10,
            )
        behind = transfers.Progress()
        with pytest.raises(transfers.Stalled):
            await transfers.unless_stalled(
                transfers.transfer(lambda: "b", project="s", progress=behind), behind, stall_s=1
            )
        assert transfers._SLOTS["s"].places.locked()  # still the hung thread's
    finally:
        hung.set()
    assert await places_given_back("s")
    assert wrote == []  # abandoned: nothing written after it was given up
    assert await transfers.transfer(lambda: "after", project="s") == "after"


async def test_a_copy_waiting_for_a_place_while_its_projects_copies_move_is_not_given_up(monkeypatch):
    """A project copying an hour of inputs holds its places, moving: a copy waiting behind it waits."""
    monkeypatch.setattr(transfers, "PER_PROJECT", 1)

    def steady() -> str:
        for _ in range(30):  # 1.5 s in all, moving every 0.05 s
            time.sleep(0.05)
            transfers.moved()
        return "inputs"

    inputs = asyncio.create_task(transfers.transfer(steady, project="q"))  # no progress of a task's: the project's
    await asyncio.sleep(0.1)
    waiting = transfers.Progress()
    last = transfers.transfer(lambda: "checkpoint", project="q", progress=waiting)
    assert await transfers.unless_stalled(last, waiting, stall_s=0.5) == "checkpoint"
    assert await inputs == "inputs"


async def test_a_copy_that_keeps_moving_is_waited_for_past_the_stall_time():
    progress = transfers.Progress()

    def steady() -> str:
        for _ in range(30):  # 1.5 s in all, moving every 0.05 s
            time.sleep(0.05)
            transfers.moved()
        return "done"

    copy = transfers.transfer(steady, project="m", progress=progress)
    assert await transfers.unless_stalled(copy, progress, stall_s=0.5) == "done"


async def test_an_upload_callback_on_another_thread_counts_on_the_copy_that_made_it():
    """s3fs sends on fsspec's own thread: its progress callbacks still count on the copy's progress."""
    from services.agent.checkpoints import Moving

    progress = transfers.Progress()

    def upload() -> float:
        callback = Moving()  # made on the copy's thread, as `Mirror.sync` makes it
        before = progress.last
        time.sleep(0.05)
        other = threading.Thread(target=callback.relative_update, args=(1024,))
        other.start()
        other.join()
        return progress.last - before

    assert await transfers.transfer(upload, project="u", progress=progress) > 0


async def test_a_cancelled_copys_awaiter_returns_at_once():
    hung = threading.Event()
    copy = asyncio.create_task(transfers.transfer(lambda: hung.wait(10), project="c"))
    await asyncio.sleep(0.1)
    copy.cancel()
    try:
        done, _ = await asyncio.wait([copy], timeout=1)
        assert done and copy.cancelled()  # not held until the thread ends
        assert transfers._SLOTS["c"].places._value == transfers.PER_PROJECT - 1  # its place still the thread's
    finally:
        hung.set()
    assert await places_given_back("c")


@pytest.fixture
def one_thread(monkeypatch):
    """A node of one transfer thread."""
    pool = ThreadPoolExecutor(max_workers=1)
    monkeypatch.setattr(transfers, "_POOL", pool)
    yield pool
    pool.shutdown(wait=False)


async def test_a_copy_queued_behind_threads_held_by_hung_copies_is_given_up_and_behind_moving_ones_waits(one_thread):
    hung = threading.Event()
    other = asyncio.create_task(transfers.transfer(lambda: hung.wait(10), project="hung"))
    await asyncio.sleep(0.1)
    try:
        queued = transfers.Progress()
        with pytest.raises(transfers.Stalled):  # the node's only thread held by a copy that moves nothing
            await transfers.unless_stalled(
                transfers.transfer(lambda: "x", project="q", progress=queued), queued, stall_s=1
            )
    finally:
        hung.set()
    await other
    assert await places_given_back("q")

    def steady() -> str:
        for _ in range(30):  # 1.5 s, moving every 0.05 s
            time.sleep(0.05)
            transfers.moved()
        return "steady"

    busy = asyncio.create_task(transfers.transfer(steady, project="busy"))
    await asyncio.sleep(0.1)
    waiting = transfers.Progress()
    copy = transfers.transfer(lambda: "after", project="w", progress=waiting)
    assert await transfers.unless_stalled(copy, waiting, stall_s=1) == "after"  # the thread's holder moves
    assert await busy == "steady"


async def test_a_copy_cancelled_before_its_turn_leaves_the_turns_holder_as_it_was(one_thread):
    """A task's copies share their progress: one cancelled while it waits for the task's turn must not clear the
    state of the one holding it (queued for a thread), or a wait behind it would be judged idle."""
    hung = threading.Event()
    blocker = asyncio.create_task(transfers.transfer(lambda: hung.wait(10), project="other"))
    await asyncio.sleep(0.1)
    shared, lock = transfers.Progress(), asyncio.Lock()
    holder = asyncio.create_task(transfers.transfer(lambda: "h", project="t", lock=lock, progress=shared))
    await asyncio.sleep(0.1)
    assert shared.queued and shared in transfers._SLOTS["t"].holders
    behind = asyncio.create_task(transfers.transfer(lambda: "b", project="t", lock=lock, progress=shared))
    await asyncio.sleep(0.1)
    behind.cancel()
    await asyncio.wait([behind])
    try:
        assert shared.queued and shared in transfers._SLOTS["t"].holders  # the holder's, untouched
    finally:
        hung.set()
    assert await holder == "h"
    await blocker
