"""The look through every process of the host for a task uid (`kill_user`, `uids_running`): each process's uids
are read, and whether it can still run (its state and threads: a second file of /proc) is asked only of a process
whose uids matter. A zombie of the uid counts as gone, a live process of it is found. Real processes."""

import os
import random
import subprocess
import time

import psutil
import pytest

from services.agent.isolation import kill_user, uids_running

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a process of another uid can be started only by root")


@pytest.fixture
def states_asked(monkeypatch) -> list[int]:
    """The pid of every process asked its state (psutil reads /proc/PID/stat for it)."""
    asked: list[int] = []
    real = psutil.Process.status

    def counted(self):
        asked.append(self.pid)
        return real(self)

    monkeypatch.setattr(psutil.Process, "status", counted)
    return asked


def unused_uid() -> int:
    taken = {u for p in psutil.process_iter(["uids"]) if p.info["uids"] for u in p.info["uids"]}
    return next(uid for uid in iter(lambda: random.randrange(300_000, 900_000), None) if uid not in taken)


def test_a_look_for_a_uid_no_process_has_asks_no_process_its_state(states_asked):
    """Every process was asked its state before (a read of its stat file beside its status file): half the look."""
    assert kill_user(unused_uid()) == 0
    assert states_asked == []


def test_every_uid_is_found_with_its_state_asked_of_few_processes(states_asked):
    running = uids_running()
    assert os.getuid() in running and os.geteuid() in running
    assert len(states_asked) < len(psutil.pids()) / 2  # one process for each new uid, not each process


def as_uid(uid: int, command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, user=uid, group=uid, extra_groups=[], cwd="/")


def become_zombie(process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)


@root_only
def test_a_live_process_of_the_uid_is_found_and_killed_and_its_zombie_is_not(states_asked):
    uid = unused_uid()
    sleeper = as_uid(uid, ["sleep", "60"])
    try:
        assert uid in uids_running()
        assert kill_user(uid) == 1
        assert sleeper.wait(timeout=10) == -9
        exited = as_uid(uid, ["true"])
        become_zombie(exited)  # not reaped: still listed, its uid with it
        states_asked.clear()
        assert kill_user(uid) == 0 and uid not in uids_running()
        assert exited.pid in states_asked  # asked, as a process of the uid, and found unable to run
        exited.wait()
    finally:
        sleeper.kill()
        sleeper.wait()
