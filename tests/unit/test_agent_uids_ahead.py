"""A root agent verifies its first task uids at start (`TaskUsers.ready_ahead`), as a claim would, so that its first
tasks' claims need no look through every process of the host (the first job after a start waited for one).
Real processes."""

import os
import random
import subprocess

import psutil
import pytest

from services.agent.isolation import GIVEN_BACK, TaskUsers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks get users of their own only under root")


@pytest.fixture
def scans(monkeypatch) -> list[int]:
    """Every look through all processes of the host (psutil.process_iter), counted."""
    calls: list[int] = []
    real = psutil.process_iter

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(psutil, "process_iter", counted)
    return calls


def test_uids_readied_at_start_are_claimed_without_a_look(tmp_path, scans):
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=4, lock_dir=tmp_path / "uids")
    assert users.ready_ahead(2) == 2 and len(scans) == 1  # one look for both
    scans.clear()
    assert users.claim().uid == first and users.claim().uid == first + 1
    assert scans == []  # a fresh agent's first claims looked through every process before
    assert not (tmp_path / "uids" / str(first + 2)).exists()  # past `count`: left to its claim


def test_a_uid_with_a_process_left_is_not_readied_and_its_claim_still_looks(tmp_path, scans):
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=2, lock_dir=tmp_path / "uids")
    left = subprocess.Popen(["sleep", "300"], user=first, group=first, start_new_session=True)  # its agent died
    try:
        assert users.ready_ahead(2) == 1
        assert (tmp_path / "uids" / str(first)).read_bytes() != GIVEN_BACK
        scans.clear()
        assert users.claim().uid == first + 1 and len(scans) == 1  # the uid with a process looked at, and skipped
    finally:
        left.kill()
        left.wait()


def test_a_uid_held_by_a_task_is_left_to_it(tmp_path):
    first = random.randrange(300_000, 900_000, 100)
    users = TaskUsers(first_uid=first, count=2, lock_dir=tmp_path / "uids")
    held = users.claim()
    assert held.uid == first
    assert users.ready_ahead(2) == 1  # only the free one
    assert (tmp_path / "uids" / str(first)).read_bytes() == b""  # the holder's, untouched
    os.close(held.lock_fd)
