"""SIGKILLs every process of a task uid at once, from a process no process of that uid can signal (standard library
only; the root agent runs it with `python -I -S killer.py <uid> <shadow uid>`).

kill(-1) signals every process its sender may signal, in one pass no fork completes during (a process that forks its
successor and exits cannot slip past it). Its sender here has the task's uid as its effective uid, so it reaches
every process whose real or saved uid is the task's; its real and saved uid are the shadow, a uid no account, range
or process has, so no process of the task may signal it (a kill sent as the task's uid itself can be killed by a
process of that uid before it is sent). Exit status: 0 sent, 1 not sent, 3 the shadow cannot be taken (an unmapped
uid in a user namespace: the caller decides what to do instead), 2 misuse.

`killer.py --serve` is the same, once a kill: it reads "<uid> <shadow uid>" lines on its standard input and, for
each, forks a child that takes the uids and sends the kill, and writes the child's exit status as a line (a Python
start costs ~15 ms of CPU, a fork of this one-threaded process well under one). It ends at the end of its input
(the agent is gone).
"""

import os
import signal
import sys

LAST_UID = 2**32 - 2  # (uid_t)-1 means "unchanged" to setresuid: the killer would keep root's real uid


def main(argv: list[str]) -> int:
    try:
        uid, shadow = (int(a) for a in argv)
    except ValueError:
        return 2
    if not (0 < uid <= LAST_UID and 0 < shadow <= LAST_UID):  # a real uid of 0 would reach every root process
        return 2
    try:
        os.setgroups([])
        os.setresgid(shadow, shadow, shadow)
        os.setresuid(shadow, uid, shadow)  # every uid non-zero: no capability is left (CAP_KILL included)
    except OSError:
        return 3
    if os.getresuid() != (shadow, uid, shadow):
        return 2
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:  # no process at all but this one
        pass
    except OSError:
        return 1
    return 0


def serve() -> int:
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:  # the child alone changes its uids: this process stays root for the next kill
            code = 2
            try:
                code = main(line.split())
            finally:  # never back into this loop (reading the agent's stdin beside its parent), whatever main raised
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"{os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1:]))
