"""Group commit: each caller gets its own answer; a burst is written in few groups, in arrival order."""

import asyncio

import pytest

from shared.batch import GroupCommit


class Recorder:
    """A group write that takes a while, remembers its groups, and refuses odd numbers (each on its own)."""

    def __init__(self, *, delay: float = 0.01, fail: Exception | None = None) -> None:
        self.groups: list[list[int]] = []
        self.delay, self.fail = delay, fail

    async def __call__(self, group: list[int]) -> list:
        self.groups.append(group)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise self.fail
        return [ValueError(f"odd {n}") if n % 2 else n * 10 for n in group]


async def test_a_burst_is_written_in_few_groups_and_each_caller_gets_its_own_answer():
    write = Recorder()
    commit = GroupCommit(write)
    answers = await asyncio.gather(*(commit(n) for n in range(20)), return_exceptions=True)
    assert [a if isinstance(a, int) else str(a) for a in answers] == [
        n * 10 if n % 2 == 0 else f"odd {n}" for n in range(20)
    ]
    assert write.groups == [list(range(20))]  # all arrived before the writer ran: one group, in arrival order
    late = [asyncio.create_task(commit(n)) for n in (20, 22)]
    await asyncio.sleep(0)  # both arrive; the writer starts on them before 24 arrives, which waits for the next
    late.append(asyncio.create_task(commit(24)))
    assert await asyncio.gather(*late) == [200, 220, 240]
    assert write.groups[1:] == [[20, 22], [24]]
    assert commit.groups == 3


async def test_a_lone_caller_is_written_at_once_and_groups_respect_their_size():
    write = Recorder()
    commit = GroupCommit(write, max_size=3)
    assert await commit(4) == 40
    await asyncio.gather(*(commit(n) for n in (0, 2, 4, 6, 8, 10, 12)))
    assert write.groups == [[4], [0, 2, 4], [6, 8, 10], [12]]


async def test_a_failed_group_write_fails_every_caller_of_that_group_only():
    write = Recorder(fail=ConnectionError("database away"))
    commit = GroupCommit(write)
    answers = await asyncio.gather(*(commit(n) for n in (0, 2, 4)), return_exceptions=True)
    assert all(isinstance(a, ConnectionError) for a in answers)
    write.fail = None
    assert await commit(6) == 60  # the next group is written as usual


async def test_a_write_that_answers_the_wrong_number_of_items_fails_its_group():
    async def short(group: list[int]) -> list:
        return group[:-1]

    commit = GroupCommit(short)
    answers = await asyncio.gather(commit(1), commit(2), return_exceptions=True)
    assert [str(a) for a in answers] == ["a group write answered 1 of 2 items"] * 2


async def test_a_caller_that_stops_waiting_does_not_take_its_item_back():
    write = Recorder(delay=0.05)
    commit = GroupCommit(write)
    first = asyncio.create_task(commit(0))
    await asyncio.sleep(0)
    second = asyncio.create_task(commit(2))  # waits for the next group
    await asyncio.sleep(0.01)
    second.cancel()
    assert await first == 0
    await asyncio.sleep(0.1)
    assert write.groups == [[0], [2]]  # written all the same; nobody was left to answer
    assert await commit(4) == 40


def test_a_group_size_below_one_is_refused():
    with pytest.raises(ValueError, match="max_size"):
        GroupCommit(Recorder(), max_size=0)


async def test_callers_waiting_when_the_writer_is_cancelled_are_cancelled_not_left_waiting():
    commit = GroupCommit(Recorder(delay=10))
    callers = [asyncio.create_task(commit(n)) for n in (0, 2)]
    await asyncio.sleep(0.01)
    commit._writer.cancel()  # the service shutting down mid-write
    answers = await asyncio.gather(*callers, return_exceptions=True)
    assert all(isinstance(a, asyncio.CancelledError) for a in answers) and commit._writer is None


async def test_callers_of_one_window_go_out_in_one_group_and_a_shutdown_during_the_window_cancels_them():
    write = Recorder()
    commit = GroupCommit(write, window_s=0.05)
    first = asyncio.create_task(commit(0))
    await asyncio.sleep(0.01)  # well inside the window: it waits for the others
    assert write.groups == []
    assert await asyncio.gather(first, commit(2)) == [0, 20]
    assert write.groups == [[0, 2]]
    waiting = [asyncio.create_task(commit(n)) for n in (4, 6)]
    await asyncio.sleep(0.01)
    assert commit._writer is not None
    commit._writer.cancel()  # the broker stops during the window: nobody is left waiting, nothing is written
    for task in waiting:
        with pytest.raises(asyncio.CancelledError):
            await task
    assert write.groups == [[0, 2]]
