"""A task uid claimed ahead: a fresh range's first claim looks through every process of the host (and starts the
killer), which a node's first task used to wait for (~150 ms of its submit → Running right after a stack's start)."""

import os
import random

import pytest

from shared.events import TaskStarted
from services.agent import isolation
from services.agent.isolation import GIVEN_BACK, TaskUsers
from tests.factories import unique
from tests.unit.test_agent_isolation import make_agent, run, start
from tests.unit.test_agent_task_processes import root_only, scans  # noqa: F401 - scans is a fixture


@root_only
def test_a_uid_claimed_ahead_is_the_next_claim_taken_without_a_look_and_no_one_elses_meanwhile(tmp_path, scans):
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=3, lock_dir=tmp_path / "uids")
    users.ready_one()
    assert len(scans) == 1
    users.ready_one()  # one is ready: nothing more
    assert len(scans) == 1
    other_agent = TaskUsers(first_uid=first, count=3, lock_dir=tmp_path / "uids")
    assert other_agent.claim().uid == first + 1  # held ahead: no other agent of the host takes it
    scans.clear()
    taken = users.claim()
    assert taken.uid == first and scans == []
    assert (users.lock_dir / str(first)).read_bytes() == b""  # in use: an agent dying now leaves it to be looked for


@root_only
def test_a_uid_given_back_stays_marked_while_it_is_held_ahead(tmp_path, scans):
    """An agent that dies holding a uid ahead leaves it as it found it: nothing ran as it."""
    first = random.randrange(300_000, 900_000, 100)
    (tmp_path / "uids").mkdir(mode=0o700)
    (tmp_path / "uids" / str(first)).write_bytes(GIVEN_BACK)
    users = TaskUsers(first_uid=first, count=1, lock_dir=tmp_path / "uids")
    users.ready_one()
    assert scans == [] and (users.lock_dir / str(first)).read_bytes() == GIVEN_BACK
    assert users.claim().uid == first


@root_only
def test_a_full_range_readies_none_and_a_claim_then_says_so(tmp_path):
    users = TaskUsers(first_uid=random.randrange(300_000, 900_000, 100), count=1, lock_dir=tmp_path / "uids")
    held = users.claim()
    users.ready_one()  # every uid taken: nothing readied, nothing raised
    with pytest.raises(isolation.NoTaskUser):
        users.claim()
    os.close(held.lock_fd)


@root_only
async def test_an_agent_that_came_up_starts_its_first_task_without_looking_through_every_process(tmp_path, monkeypatch):
    """The look for a fresh uid's processes is made at the agent's start, before it registers; one task after another
    then reuse the uid given back, claimed ahead as each ends, without a look."""
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)
    looks: list[bool] = []  # for each look: whether the task's start was reported before it
    real = isolation.uids_running

    def counted() -> set[int]:
        looks.append(any(isinstance(m, TaskStarted) for m in sent))
        return real()

    monkeypatch.setattr(isolation, "uids_running", counted)

    async def no_loops() -> None:
        return None

    await agent.come_up(no_loops)
    assert looks == [False]  # at its start, before it registered
    assert isolation.KILLERS._process is not None and isolation.KILLERS._process.poll() is None
    looks.clear()
    for name in ("first", "second"):  # the second takes the first's uid, given back and claimed ahead again
        ended, output = await run(agent, start(unique(name), "id -u"), sent)
        assert ended.reason == "completed", output
    assert looks == []
    # every chunk's lines: a task's last chunk is empty when its line went out before its end (under load)
    uids = [int(line.line) for m in sent if type(m).__name__ == "LogChunk" for line in m.lines]
    assert len(uids) == 2 and uids[0] == uids[1]


@root_only
async def test_an_agent_whose_uid_cannot_be_readied_comes_up_all_the_same(tmp_path, monkeypatch, caplog):
    """A lock directory gone bad fails each task's own claim, as before; the agent still registers."""
    sent: list = []
    agent = make_agent(tmp_path, sent, confined=True)

    def broken() -> None:
        raise PermissionError("the lock directory")

    monkeypatch.setattr(agent.supervisor.confinement.users, "ready_one", broken)

    async def no_loops() -> None:
        return None

    await agent.come_up(no_loops)
    assert "could not claim a task uid ahead" in caplog.text
    assert any(type(m).__name__ == "NodeRegistered" for m in sent)
