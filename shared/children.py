"""Child processes that do not outlive the process that started them."""

import ctypes
import os
import sys
from collections.abc import Callable

_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15


def dies_with_parent(sig: int) -> Callable[[], None] | None:
    """A child's pre-exec step (`preexec_fn`): the kernel sends it `sig` when its parent dies, however it dies
    (killed, crashed, a test run interrupted before its fixtures stopped the stack). Orphaned services used to run
    on for hours, reconnecting to a bus and a database that were gone. None off Linux (no such call)."""
    if _LIBC is None:
        return None
    parent = os.getpid()
    return lambda: die_with(parent, sig)


def die_with(parent: int, sig: int) -> None:
    """In a child of `parent`: the kernel sends this process `sig` when its parent dies (nothing off Linux)."""
    if _LIBC is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above: nobody is left to signal us
        os.kill(os.getpid(), sig)


def name_process(name: str) -> None:
    """The process's name as `ps -o comm` and /proc/PID/comm show it (the kernel keeps 15 bytes)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
