"""SIGKILLs every process of a task uid at once, from a process no process of that uid can signal (standard library
only; the root agent runs it with `python -I -S killer.py <uid> <shadow uid>`).

kill(-1) signals every process its sender may signal, in one pass no fork completes during (a process that forks its
successor and exits cannot slip past it). Its sender here has the task's uid as its effective uid, so it reaches
every process whose real or saved uid is the task's; its real and saved uid are the shadow, a uid no account, range
or process has, so no process of the task may signal it (a kill sent as the task's uid itself can be killed by a
process of that uid before it is sent). Exit status: 0 sent, 1 not sent, 3 the shadow cannot be taken (an unmapped
uid in a user namespace: the caller decides what to do instead), 2 misuse.
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
