"""What a task's uid leaves behind on the host, removed before the uid is given to another task.

With an IPC namespace and private temporary directories per task these die with it (but for message queues made
through the host's /dev/mqueue: `OUTLIVING_NAMESPACES`); on a host without namespaces
(no CAP_SYS_ADMIN) the task's System V objects (shared memory, semaphores, message queues) and its files at the
top of the host's temporary directories (POSIX shared memory and message queues are files there) would otherwise
wait for the next task given the same uid.
"""

import ctypes
import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger(__name__)

SYSVIPC = Path("/proc/sysvipc")
IPC_RMID = 0
KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}  # /proc/sysvipc file: its id column
HOST_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
# A POSIX message queue made through the path of an mqueue mount belongs to the IPC namespace that mounted it: a task
# in an IPC namespace of its own still sees, and makes queues in, the host's /dev/mqueue (no cover hides it)
OUTLIVING_NAMESPACES = ("/dev/mqueue",)


def ipc_ids(text: str, *, id_column: str, uid: int) -> list[int]:
    """The ids of the objects in a /proc/sysvipc table owned (or created) by `uid`."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    try:
        at_id, at_uid, at_cuid = header.index(id_column), header.index("uid"), header.index("cuid")
    except ValueError:
        return []
    return [
        int(row[at_id])
        for row in lines[1:]
        if len(row) > max(at_id, at_uid, at_cuid) and str(uid) in (row[at_uid], row[at_cuid])
    ]


def _remove_ipc(kind: str, ident: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    result = {
        "shm": lambda: libc.shmctl(ident, IPC_RMID, None),
        "sem": lambda: libc.semctl(ident, 0, IPC_RMID),
        "msg": lambda: libc.msgctl(ident, IPC_RMID, None),
    }[kind]()
    if result != 0:
        log.warning("removing System V %s %d failed: %s", kind, ident, os.strerror(ctypes.get_errno()))


def sweep_ipc(uid: int, *, root: Path = SYSVIPC) -> int:
    """Remove every System V IPC object of `uid` this agent's IPC namespace shows; how many."""
    removed = 0
    for kind, column in KINDS.items():
        try:
            text = (root / kind).read_text()
        except OSError:
            continue
        for ident in ipc_ids(text, id_column=column, uid=uid):
            _remove_ipc(kind, ident)
            removed += 1
    return removed


def sweep_files(uid: int, *, dirs: tuple[str, ...] = HOST_TEMP_DIRS) -> int:
    """Remove what `uid` owns at the top of the host's temporary directories (a directory with all it holds,
    following no link); how many entries."""
    removed = 0
    for top in dirs:
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != uid:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
            except OSError as exc:
                log.warning("removing %s of uid %d failed: %r", entry.path, uid, exc)
    return removed


def sweep(uid: int, *, isolated: bool = False) -> None:
    """Everything `uid` left on the host outside its working directory (its processes are killed already); of a
    task that ran `isolated` (mount and IPC namespaces of its own, its temporary folders private), only what
    outlives those (`OUTLIVING_NAMESPACES`)."""
    if isolated:
        ipc, files = 0, sweep_files(uid, dirs=OUTLIVING_NAMESPACES)
    else:
        ipc, files = sweep_ipc(uid), sweep_files(uid, dirs=HOST_TEMP_DIRS)
    if ipc or files:
        log.info("removed %d System V IPC objects and %d temporary files left by task uid %d", ipc, files, uid)
