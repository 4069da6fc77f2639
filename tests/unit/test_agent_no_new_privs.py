"""A task gains no privilege by exec: a set-user-ID file (another task's, left in a shared directory, or the host's)
runs with the task's own uid. Real processes, as root (the agent's tasks run as users of their own only then)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from services.agent import shim

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tasks run as users of their own only under root")
OWNER, TASK = 61011, 61012  # the set-user-ID file's owner (another task's uid), the task's own uid


def run_as_task(exe, *, through_shim: bool) -> str:
    me = os.getpid()
    done = subprocess.run(
        [str(exe), "-u"],
        user=TASK,
        group=TASK,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=(lambda: shim._bind_to(me)) if through_shim else None,
    )
    return done.stdout.strip()


@pytest.fixture
def shared_place():
    """A directory other uids can enter (pytest's own is its user's alone)."""
    place = Path(tempfile.mkdtemp(prefix="tm-nnp-"))
    place.chmod(0o755)
    yield place
    shutil.rmtree(place)


def test_a_set_user_id_file_of_another_uid_runs_as_the_task_itself(shared_place):
    exe = shared_place / "id"
    shutil.copy("/usr/bin/id", exe)
    os.chown(exe, OWNER, OWNER)
    exe.chmod(0o4755)
    if run_as_task(exe, through_shim=False) != str(OWNER):  # a nosuid mount: nothing to show here
        pytest.skip("set-user-ID files do not take effect under this test's directory")
    assert run_as_task(exe, through_shim=True) == str(TASK)
