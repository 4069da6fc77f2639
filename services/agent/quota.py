"""The disk a task may fill: its working directory is measured every few seconds and the task is killed past its
quota; no single file may grow past the quota at all (RLIMIT_FSIZE, set by the shim).

What bounds it: the quota plus what the task writes between two measurements (DISK_CHECK_S at the disk's write
speed). Its private /tmp, /var/tmp, /dev/shm and /run/lock are memory (tmpfs of bounded size, counted in its
memory cgroup), not disk.
"""

import asyncio
import errno
import os
import signal
import stat
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.agent.runner import TaskProcess

DISK_CHECK_S = 2.0


UNMEASURABLE = 2**62  # the usage of a tree a task made too deep to measure: past every quota
TOO_DEEP = (errno.ENAMETOOLONG, errno.ELOOP)


def disk_usage(top: str) -> int:
    """Bytes of disk used under `top` (allocated blocks, following no link, each directory counted too). A folder
    whose path is too long to open (a task nesting long names past 4,096 bytes hid what was under it from the
    quota) makes the tree `UNMEASURABLE`."""
    total, stack, seen = 0, [top], set()  # a file of several names (hard links) counted once
    while stack:
        path = stack.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError as exc:
                        if exc.errno in TOO_DEEP:
                            return UNMEASURABLE
                        continue
                    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
        except OSError as exc:
            if exc.errno in TOO_DEEP:
                return UNMEASURABLE
            continue
    return total


def over_quota(used: int, quota_gb: float) -> bool:
    return used > quota_gb * 2**30


async def past_quota(task: "TaskProcess", quota_gb: float) -> bool:
    """Whether the task's working directory holds more than `quota_gb` (noted in its last output when so)."""
    used = await asyncio.to_thread(disk_usage, str(task.workdir))
    if not over_quota(used, quota_gb):
        return False
    task.disk_full = True
    task.tail.append(
        f"killed by trainmaster: wrote more than {quota_gb:g} GB to its work directory ({used / 2**30:.2f} GB)"
    )
    return True


async def enforce_disk(task: "TaskProcess", quota_gb: float, *, every_s: float = DISK_CHECK_S) -> None:
    """Kill the whole task once its working directory holds more than `quota_gb`."""
    while task.process.returncode is None:
        if await past_quota(task, quota_gb):
            try:
                os.killpg(task.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        await asyncio.sleep(every_s)
