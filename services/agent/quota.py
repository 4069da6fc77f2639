"""The disk a task may fill: its working directory is measured every few seconds and the task is killed past its
quota; no single file may grow past the quota at all (RLIMIT_FSIZE, set by the shim).

What bounds it: the quota plus what the task writes between two measurements (DISK_CHECK_S at the disk's write
speed). Each file and folder counts as at least its share of the disk's inodes (`inode_share`): empty files take no
blocks, and a task that made millions of them used up the node's inodes (every other task's next file refused)
within a quota that measured nothing. Its private /tmp, /var/tmp, /dev/shm and /run/lock are memory (tmpfs of
bounded size, counted in its memory cgroup), not disk.
"""

import asyncio
import errno
import os
import signal
import stat
from typing import TYPE_CHECKING

from services.agent.mounts import mounts, read_mountinfo

if TYPE_CHECKING:
    from services.agent.runner import TaskProcess

DISK_CHECK_S = 2.0


UNMEASURABLE = 2**62  # the usage of a tree a task made too deep to measure: past every quota
TOO_DEEP = (errno.ENAMETOOLONG, errno.ELOOP)
MAX_INODE_SHARE = 64 * 1024  # a file system that reports very few inodes (or odd figures) charges no more a file


FIXED_INODES = frozenset({"ext2", "ext3", "ext4", "tmpfs"})  # file systems whose inodes are set when made


def inode_share(path: str) -> int:
    """The bytes of disk per inode of the file system holding `path` (ext4's default is 16 KiB): what a file or
    folder counts for at least, so a quota that is a share of the disk is the same share of its inodes. Only where
    the number of inodes is fixed (`FIXED_INODES`): XFS and ZFS report a count that shrinks as the disk fills (a
    neighbour filling it would raise every task's share), btrfs none, a network file system its server's; 0 there.
    Found once per file system (its device): the quota asks for every task every few seconds."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return 0
    if (share := _SHARES.get(device)) is None:
        share = _SHARES[device] = _share_of(path)
    return share


_SHARES: dict[int, int] = {}  # device -> its inode share (fixed: only file systems whose inodes are set when made)


def _share_of(path: str) -> int:
    if filesystem_of(path) not in FIXED_INODES:
        return 0
    try:
        fs = os.statvfs(path)
    except OSError:
        return 0
    if fs.f_files <= 0:
        return 0
    return min(MAX_INODE_SHARE, fs.f_blocks * fs.f_frsize // fs.f_files)


def filesystem_of(path: str, mountinfo: str | None = None) -> str:
    """The type of the file system `path` is on: that of its longest mount point (empty where none is known)."""
    where = os.path.realpath(path)
    best, kind = -1, ""
    for point, fs in mounts(read_mountinfo() if mountinfo is None else mountinfo):
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fs
    return kind


def disk_usage(top: str, *, floor: int = 0, limit: int | None = None) -> int:
    """Bytes of disk used under `top` (allocated blocks, following no link, each directory counted too; each entry
    at least `floor`). A folder whose path is too long to open (a task nesting long names past 4,096 bytes hid what
    was under it from the quota) makes the tree `UNMEASURABLE`. With `limit`, the walk ends as soon as the total
    passes it (what it returns is then past `limit`, not the whole): a tree of millions of entries is not walked
    to its end, nor are its folders all held at once, to find it over a quota."""
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
                    total += max(st.st_blocks * 512, floor)
                    if limit is not None and total > limit:
                        return total
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
    """Whether the task's working directory holds more than `quota_gb`, each file and folder counted as at least
    its share of the disk's inodes (noted in its last output when so)."""
    top = str(task.workdir)
    floor = inode_share(top)  # found once per file system: a stat here
    used = await asyncio.to_thread(disk_usage, top, floor=floor, limit=int(quota_gb * 2**30))
    if not over_quota(used, quota_gb):
        return False
    task.disk_full = True
    counted = f"; each file and folder counts as at least {floor:,} bytes, its share of the disk's inodes"
    task.tail.append(
        f"killed by trainmaster: wrote more than {quota_gb:g} GB to its work directory"
        + (f" ({used / 2**30:.2f} GB at least{counted if floor else ''})" if used < UNMEASURABLE else " (too deep)")
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
