"""The look through every process of the host for a task uid (`kill_user`, `uids_running`): each process's status
file read once, its real, effective and saved uid and whether it can still run (its state and threads) taken from
that one read. A zombie of the uid counts as gone, a live process of it is found, and a process cannot pass itself
off as another uid's by what it names itself. Real processes."""

import os
import random
import subprocess
import sys
import time

import pytest

from services.agent import isolation
from services.agent.isolation import HostProcess, kill_user, parse_status, read_status, uids_running

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a process of another uid can be started only by root")


def unused_uid() -> int:
    taken = uids_running()
    return next(uid for uid in iter(lambda: random.randrange(300_000, 900_000), None) if uid not in taken)


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """The pid of every status file read."""
    read: list[int] = []
    real = isolation.read_status

    def counted(pid: int) -> HostProcess | None:
        read.append(pid)
        return real(pid)

    monkeypatch.setattr(isolation, "read_status", counted)
    return read


def test_a_look_reads_each_process_once(reads):
    uid = unused_uid()
    reads.clear()
    assert kill_user(uid) == 0
    assert reads and len(reads) == len(set(reads))


def test_every_uid_is_found():
    running = uids_running()
    assert os.getuid() in running and os.geteuid() in running


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"Name:\tpython\nState:\tS (sleeping)\nUid:\t5\t6\t7\t8\nThreads:\t3\n", HostProcess(9, (5, 6, 7), True)),
        (b"Name:\tx\nState:\tZ (zombie)\nUid:\t5\t6\t7\t8\nThreads:\t1\n", HostProcess(9, (5, 6, 7), False)),
        # a thread group whose leader alone exited: its other threads still run as the uid
        (b"Name:\tx\nState:\tZ (zombie)\nUid:\t5\t6\t7\t8\nThreads:\t2\n", HostProcess(9, (5, 6, 7), True)),
        (b"Name:\tx\nState:\tR (running)\nUid:\t5\t6\t7\t8", HostProcess(9, (5, 6, 7), True)),  # no final break
        (b"Name:\tx\nState:\tS (sleeping)\n", None),
        (b"Name:\tx\nUid:\t5\tsix\t7\t8\n", None),
        (b"Name:\tx\nUid:\t5\t6\n", None),
    ],
)
def test_a_status_file_is_read_by_its_lines(text, expected):
    assert parse_status(9, text) == expected


def test_a_process_named_like_a_uid_line_is_read_by_its_own_uids():
    """The one field of the file a process sets is its name; the kernel writes its line breaks escaped."""
    forged = (
        "import ctypes, sys, time\n"
        "ctypes.CDLL(None).prctl(15, b'\\nUid:\\t1 1 1\\n', 0, 0, 0)\n"
        "print('named', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", forged], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None and process.stdout.readline() == b"named\n"
        found = read_status(process.pid)
        assert found is not None and found.uids == (os.getuid(), os.geteuid(), os.geteuid())
        with open(f"/proc/{process.pid}/comm", "rb") as comm:
            assert comm.read() == b"\nUid:\t1 1 1\n\n"  # named so (the kernel ends the name with a line break)
    finally:
        process.kill()
        process.wait()


def test_a_process_gone_before_its_read_is_left_out():
    process = subprocess.Popen(["true"])
    process.wait()
    assert read_status(process.pid) is None


def as_uid(uid: int, command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, user=uid, group=uid, extra_groups=[], cwd="/")


def become_zombie(process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while (found := read_status(process.pid)) is None or found.can_run:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)


@root_only
def test_a_live_process_of_the_uid_is_found_and_killed_and_its_zombie_is_not():
    uid = unused_uid()
    sleeper = as_uid(uid, ["sleep", "60"])
    try:
        assert uid in uids_running()
        assert kill_user(uid) == 1
        assert sleeper.wait(timeout=10) == -9
        exited = as_uid(uid, ["true"])
        become_zombie(exited)  # not reaped: still listed, its uid with it
        assert kill_user(uid) == 0 and uid not in uids_running()
        exited.wait()
    finally:
        sleeper.kill()
        sleeper.wait()


@root_only
def test_a_process_with_the_uid_as_its_saved_uid_only_is_found():
    """A process with another real and effective uid that keeps the task's as its saved one can take it back: it
    is the task's."""
    uid, other = unused_uid(), unused_uid()
    drop = f"os.setgroups([]); os.setresgid({other}, {other}, {other}); os.setresuid({other}, {other}, {uid})"
    process = subprocess.Popen([sys.executable, "-c", f"import os, time; {drop}; time.sleep(60)"], cwd="/")
    try:
        deadline = time.monotonic() + 10
        while (found := read_status(process.pid)) is None or found.uids[0] != other:
            assert process.poll() is None and time.monotonic() < deadline, "it did not drop to the other uid"
            time.sleep(0.01)
        assert found.uids == (other, other, uid)
        assert kill_user(uid) == 1
        assert process.wait(timeout=10) == -9
    finally:
        process.kill()
        process.wait()
