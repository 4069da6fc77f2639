"""Runs one task command so that it never outlives its agent (standard library only).

The agent starts this as the leader of a new process group. The kernel sends SIGUSR2 when the agent dies
(parent-death signal); the shim then SIGKILLs its whole group, grandchildren included. A SIGTERM from the agent
reaches the whole group directly; the shim waits for the command and exits as the command did.
"""
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    command = sys.argv[1]
    signal.signal(signal.SIGUSR2, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGUSR2)
    if os.getppid() == 1:  # the agent died before the signal was armed
        os.killpg(os.getpgrp(), signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the command gets its own SIGTERM from the group signal
    child = subprocess.Popen(["/bin/sh", "-c", command], restore_signals=True,
                             preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
