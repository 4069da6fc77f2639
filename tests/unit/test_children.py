"""A child started with `dies_with_parent` does not outlive its parent, however the parent dies."""

import os
import signal
import subprocess
import sys
import time

import pytest

from services.stack.processes import alive

PARENT = """
import signal, subprocess, sys
from shared.children import dies_with_parent
child = subprocess.Popen(["sleep", "60"], start_new_session=True, preexec_fn=dies_with_parent(signal.SIGKILL))
print(child.pid, flush=True)
signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_child_dies_when_its_parent_is_killed():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.05)
    assert not alive(child)
