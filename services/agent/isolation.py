"""Each task as an unprivileged user of its own: uids from a range, claimed across every agent of the host.

A uid is claimed with a lock file (held while the task runs; it goes with the agent if the agent dies) and only
when no process of that uid is alive. When the task ends every process of its uid is killed, what it left on the
host (System V IPC, temporary files) is removed and its working directory is given back to the agent's user, so
the next task that gets the uid finds nothing of this one. A uid given back that way, once a last look found no
process of it and its cgroup was emptied, is marked so in its lock file: the next claim takes it without looking
through every process of the host (a uid whose last task's agent died before it gave the uid back, or whose release
could not be verified, is looked for among them, as is one never used).
"""

import atexit
import contextlib
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from services.agent.cgroups import Cgroups, TaskCgroup, remove
from services.agent.gpudevices import GpuFile
from services.agent.leftovers import sweep
from services.agent.mounts import mounts, read_mountinfo
from services.agent.uidrange import LAST_UID

log = logging.getLogger(__name__)


class NoTaskUser(RuntimeError):
    """Every uid of the range is taken."""


@dataclass(frozen=True)
class TaskUser:
    uid: int
    gid: int
    lock_fd: int


def account_name(uid: int) -> str:
    """The task user's name in its own /etc/passwd (and in USER, LOGNAME)."""
    return f"tm-{uid}"


def is_root() -> bool:
    return os.geteuid() == 0


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) as the agent's own: a real directory, mode 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise RuntimeError(f"{path} must be a directory owned by uid {os.geteuid()}")
    os.chmod(path, 0o700)
    return path


class TaskUsers:
    def __init__(self, *, first_uid: int, count: int, lock_dir: Path) -> None:
        if first_uid < 1000 or count < 1:
            raise ValueError("task uids must be a non-empty range above the system's (first uid >= 1000)")
        if first_uid + count - 1 > LAST_UID:
            raise ValueError(f"task uids must end at or below {LAST_UID} (the uids above are their killers')")
        self.first_uid, self.count = first_uid, count
        self.lock_dir = private_dir(lock_dir)
        self._spare: TaskUser | None = None  # claimed ahead by `ready_one`, for the next `claim`
        self._spare_lock = threading.Lock()

    def claim(self) -> TaskUser:
        """A uid no running process has and no other task holds: the one `ready_one` claimed ahead if there is one,
        else one found now (one not marked given back is looked for among every process of the host, and what the
        look could not see is killed by `kill_as`)."""
        with self._spare_lock:
            user, self._spare = self._spare, None
        user = user or self._verified()
        os.ftruncate(user.lock_fd, 0)  # in use: an agent that dies now leaves it to be looked for
        return user

    def ready_one(self) -> None:
        """Claim a uid ahead for the next `claim` (verified as `claim` does, its lock held, its lock file left as it
        was), unless one is ready or every uid is taken: a fresh range's first claim looks through every process of
        the host and starts the killer, which a task's start then does not wait for. Nothing can start as the uid
        meanwhile: only a task is given it, and its lock is ours."""
        with self._spare_lock:
            if self._spare is not None:
                return
        try:
            user = self._verified()
        except NoTaskUser:
            return
        with self._spare_lock:
            if self._spare is None:
                self._spare = user
                return
        os.close(user.lock_fd)  # another thread readied one meanwhile

    def _verified(self) -> TaskUser:
        """A uid whose lock this process now holds, with no process of it alive; its lock file not yet changed."""
        busy: set[int] | None = None  # the uids of every process of the host, looked up once where needed
        for uid in range(self.first_uid, self.first_uid + self.count):
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    continue
                raise
            if os.pread(fd, len(GIVEN_BACK) + 1, 0) != GIVEN_BACK:
                busy = uids_running() if busy is None else busy
                if uid in busy or not kill_as(uid):  # one the look could not see (forking its successor) is killed
                    os.close(fd)
                    continue
            return TaskUser(uid=uid, gid=uid, lock_fd=fd)
        raise NoTaskUser(f"all {self.count} task uids from {self.first_uid} are in use")

    def release(
        self, user: TaskUser, *, workdir: Path, cgroup: TaskCgroup | None = None, isolated: bool = False
    ) -> None:
        """Give the uid back once nothing of its task is left: its cgroup emptied and removed, every process of its
        uid killed (whatever its cgroup did not hold) until a look finds none, its working directory the agent's
        again, System V IPC and temporary files removed (of a task that ran `isolated`, in IPC and mount namespaces
        of its own with its temporary folders its own, where what it made died with them, only the host's message
        queues: the host's temporary folders were 2 ms of CPU a task to look through); then mark it given back. A
        uid whose cgroup could not be emptied, or with a process still there after `EVICT_WAIT_S`, is not marked:
        its next claim looks for it."""
        emptied = remove(cgroup) if cgroup is not None else True
        gone = evict(user.uid)
        chown_tree(workdir, uid=os.geteuid(), gid=os.getegid())
        sweep(user.uid, isolated=isolated)
        if emptied and gone:
            os.pwrite(user.lock_fd, GIVEN_BACK, 0)
        else:
            log.warning("task uid %d given back unverified: its next claim looks for its processes", user.uid)
        os.close(user.lock_fd)


GIVEN_BACK = b"given back\n"  # a lock file's text once its uid's last task left nothing
EVICT_WAIT_S = 5.0  # how long a uid's processes may take to die before its release counts as unverified
KILLER_EXIT_WAIT_S = 2.0  # how long the process's end waits for a kill under way before it stops the killer
KILLER_WAIT_S = 30.0  # how long the killer (a Python start: seconds on a loaded host) may take to send its kill
STATUS_READ = 16384  # a status file is 1-2 KiB; read on until its end if it is ever longer


@dataclass(frozen=True, slots=True)
class HostProcess:
    """A process of the host as its /proc/PID/status read it: its real, effective and saved uid, and whether it can
    still run (not a zombie, unless a thread group whose leader alone exited)."""

    pid: int
    uids: tuple[int, int, int]
    can_run: bool


def parse_status(pid: int, text: bytes) -> HostProcess | None:
    """A process from its status file's text; None when the text has no uids. Each field is read at the start of
    a line, the first time it occurs: the one field a process sets (its name, the first line) is written by the
    kernel with its line breaks escaped, so no process can add a line of its own."""
    uids = field(text, b"Uid")
    try:
        real, effective, saved = (int(u) for u in uids.split()[:3])
    except ValueError:
        return None
    zombie = field(text, b"State").startswith(b"Z")
    return HostProcess(pid, (real, effective, saved), not (zombie and field(text, b"Threads") == b"1"))


def field(text: bytes, key: bytes) -> bytes:
    """A status file's field (its first line starting with `key:`), stripped; empty where there is none."""
    start = text.find(b"\n" + key + b":")
    if start < 0:
        return b""
    start += len(key) + 2
    end = text.find(b"\n", start)
    return text[start : end if end >= 0 else len(text)].strip()


def read_status(pid: int) -> HostProcess | None:
    """A process read from /proc (one file, no library between: the look below runs at every task's end over every
    process of the host); None for one gone or unreadable."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = [os.read(fd, STATUS_READ)]
        while len(chunks[-1]) == STATUS_READ:
            chunks.append(os.read(fd, STATUS_READ))
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_status(pid, b"".join(chunks))


def host_processes() -> Iterator[HostProcess]:
    """A look through every process of the host: every pid listed first, then each read in turn (one gone by then
    is left out, one started after the listing is not seen: `kill_as` covers those)."""
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    for pid in pids:
        process = read_status(pid)
        if process is not None:
            yield process


def uids_running() -> set[int]:
    """Every uid (real, effective or saved) a process of the host that can still run runs as."""
    found: set[int] = set()
    for process in host_processes():
        if process.can_run:
            found.update(process.uids)
    return found


def kill_user(uid: int) -> int:
    """SIGKILL every process of `uid` (real, effective or saved: a task's uid is its own, whatever runs under it
    belongs to the task), found in one look through every process of the host; how many were found (a zombie is
    not: it can no longer run)."""
    killed = 0
    for process in host_processes():
        if process.can_run and uid in process.uids:
            try:
                os.kill(process.pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


KILLER = Path(__file__).resolve().parent / "killer.py"
SHADOW_UNAVAILABLE = 3  # the killer's exit status when the host cannot give it the shadow uid
SHADOW_OFFSET = 2**31  # above every range (uidrange.LAST_UID): uids no account uses, as many tools misread them


def shadow_uid(uid: int) -> int:
    """The real and saved uid of the process that kills task uid `uid`'s processes: one of its own (no two task
    uids' killers can signal each other) that no process of a task ever has."""
    return uid + SHADOW_OFFSET


class Killers:
    """The agent's killer (`killer.py --serve`): started once, it forks a child a kill, so a kill costs a fork of a
    small one-threaded process, not a Python start (~15 ms of CPU, once or more for every task a node runs). One
    kill at a time; a killer that died, or did not answer within `KILLER_WAIT_S`, is started again next time."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def run(self, uid: int, *, shadow: int) -> int:
        """The kill's exit status (`killer.py`); 1 where it could not be sent."""
        with self._lock:
            for _ in range(2):  # a killer found dead is started again once
                try:
                    process = self._started()
                    assert process.stdin is not None and process.stdout is not None
                    process.stdin.write(f"{uid} {shadow}\n".encode())
                    process.stdin.flush()
                    ready, _, _ = select.select([process.stdout], [], [], KILLER_WAIT_S)
                    line = process.stdout.readline() if ready else b""
                    if line.strip().lstrip(b"-").isdigit():
                        return int(line)
                except OSError as exc:
                    log.warning("could not kill the processes of task uid %d: %r", uid, exc)
                self.stop()
            return 1

    def _started(self) -> "subprocess.Popen[bytes]":
        if self._process is not None and self._process.poll() is not None:
            self.stop()  # it died: its pipes closed before a new one is started
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(KILLER), "--serve"],
                env={},
                cwd="/",
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        return self._process

    def warm(self) -> None:
        """Start the killer now (a Python start), not at the first kill a task's start or end waits for."""
        with self._lock:
            self._started()

    def stop(self) -> None:
        """End the killer (if it runs) and close the pipes to it (a write it never read is dropped: closing the
        pipe to a killer that died flushes it again, into a broken pipe)."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()

    def stop_at_exit(self) -> None:
        """`stop`, once no kill is under way (a daemon thread's, bounded): at the process's end."""
        if self._lock.acquire(timeout=KILLER_EXIT_WAIT_S):
            try:
                self.stop()
            finally:
                self._lock.release()


KILLERS = Killers()
atexit.register(KILLERS.stop_at_exit)  # at the process's end, not only by its parent-death signal once it is gone


def run_killer(uid: int, *, shadow: int) -> int:
    """The kill's exit status (`killer.py`), sent by the agent's killer as root with an empty environment; 1 where
    it could not be sent."""
    return KILLERS.run(uid, shadow=shadow)


@functools.cache
def warn_no_shadow() -> None:
    """Said once per agent run."""
    log.warning(
        "task uids' killers cannot take their shadow uids (from %d; not mapped in this user namespace?): the "
        "processes of a task uid are killed by a kill sent as the uid itself, which one of them can kill first",
        SHADOW_OFFSET,
    )


def kill_as(uid: int) -> bool:
    """SIGKILL, at once, every process whose real or saved uid is `uid` (kill(-1) with `uid` as the effective uid:
    no fork completes meanwhile, so a process that forks its successor and exits cannot slip past it, as it can past
    a look through every process), sent from a process whose real and saved uid is the uid's shadow, which no process
    of `uid` may signal; whether that kill was sent (False where it cannot be). Where the host cannot give the
    shadow, the kill is sent as `uid` itself (warned once): a process of the uid may then kill it first."""
    status = run_killer(uid, shadow=shadow_uid(uid))
    if status == SHADOW_UNAVAILABLE:
        warn_no_shadow()
        status = run_killer(uid, shadow=uid)
    return status == 0


def evict(uid: int) -> bool:
    """Kill every process of `uid` until, after a kill sent with it as the effective uid (`kill_as`), a look through
    every process finds none of it (those with it as their effective uid only are killed by that look); whether one
    did within `EVICT_WAIT_S` (False, logged, when a process of the uid is still there or no kill could be sent).
    The look runs even where the kill could not be sent (sent as the uid itself, a process of it may kill it)."""
    deadline = time.monotonic() + EVICT_WAIT_S
    while True:
        sent = kill_as(uid)  # where sent as the uid itself, a process of it can kill it first: the look runs anyway
        if not kill_user(uid) and sent:
            return True
        if time.monotonic() >= deadline:
            log.warning("a process of task uid %d is still there after %g s", uid, EVICT_WAIT_S)
            return False
        time.sleep(0.02)


def chown_tree(top: Path, *, uid: int, gid: int, skip: frozenset[str] = frozenset()) -> None:
    """lchown `top` and everything under it, following no link (the task may have planted some), each entry changed
    from a handle on the folder that holds it: a process of the task still running that swaps a folder for a link
    mid-walk cannot turn the walk to another place of the host (a walk by path would follow it)."""
    os.lchown(top, uid, gid)
    try:
        for root, dirs, files, folder in os.fwalk(top, follow_symlinks=False):
            for name in dirs + files:
                if root == str(top) and name in skip:
                    continue
                try:
                    os.chown(name, uid, gid, dir_fd=folder, follow_symlinks=False)
                except FileNotFoundError:
                    pass
    except RecursionError:  # a tree deeper than Python's stack (a task made it so): coreutils walks it, no link
        if skip:
            raise
        subprocess.run(["chown", "-R", "-P", "-h", f"{uid}:{gid}", "--", str(top)], check=True, timeout=600)


@dataclass(frozen=True)
class Confinement:
    """How tasks are kept apart from the agent and each other: users of their own (the agent root), or, without
    them (an agent that is not root), the same view of the host in a user namespace of the task's own."""

    users: TaskUsers | None  # None: tasks run as the agent's user, in namespaces of their own where the host lets
    reach: tuple[str, ...]  # what every task needs to reach (Python, the SDK, shared datasets)
    cover: dict[str, int]  # directories always covered in a task's view (tmpfs mode): data, home, temporary
    tmpfs_bytes: int  # the most each private temporary directory (/tmp, /dev/shm, ...) holds
    cgroups: Cgroups | None = None  # memory and process limits per task, where the host lets us make them
    # each GPU's device file by its index: a task cannot open those of GPUs it was not given (`gpudevices`)
    gpu_files: dict[int, GpuFile] = dataclasses.field(default_factory=dict)


TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# Other folders anyone may write (Ubuntu's /var/crash, a site's /scratch, Debian's /var/lib/php/sessions) are looked
# for this deep under `/` when the agent starts, and covered like /tmp: what one task left there, the next (another
# project's) would find. A folder the operator shares with tasks on purpose is named in TRAINMASTER_TASK_SHARED_DIRS.
SCAN_DEPTH = 4
SCAN_BUDGET_S = 2.0  # the look ends here (level by level: what is shallow was seen); a hung mount is not waited for
# At most this many are covered: a host user making thousands of folders anyone may write would otherwise make
# every task's start mount thousands of file systems (those past it are logged, and shared as before).
MAX_COVERED = 256
NOT_SCANNED = ("/proc", "/sys", "/dev")  # kernel views (/dev/shm and /dev/mqueue: TEMP_DIRS and the IPC namespace)
# Filesystems never walked into: a stale network mount blocks a look for good, an automounter mounts what it lists.
REMOTE_TYPES = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "autofs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p", "afs"}
)


def remote_mounts(mountinfo: str) -> list[str]:
    """The mount points of network, cluster, automounted and FUSE filesystems in /proc/self/mountinfo's text."""
    return [point for point, kind in mounts(mountinfo) if kind in REMOTE_TYPES or kind.startswith("fuse")]


def writable_by_anyone(
    root: str = "/", *, depth: int = SCAN_DEPTH, skip: tuple[str, ...] = (), budget_s: float = SCAN_BUDGET_S
) -> list[str]:
    """Folders under `root`, to `depth` levels, level by level, that any user may write (not followed through links;
    none inside `skip`, NOT_SCANNED or a remote mount; one found is not looked into: it is covered whole). Looked
    for in a thread of its own: past `budget_s` what was found by then is returned, and what was not looked at is
    logged."""
    remote = remote_mounts(read_mountinfo())
    skipped = tuple(os.path.realpath(p) for p in (*NOT_SCANNED, *skip)) + tuple(remote)
    found: list[str] = []
    left: list[str] = []  # folders not looked into when the budget ran out
    done = threading.Event()

    def inside(path: str) -> bool:
        return any(path == s or path.startswith(s.rstrip("/") + "/") for s in skipped)

    def walk() -> None:
        deadline = time.monotonic() + budget_s
        level = [root]
        for _ in range(depth):
            below: list[str] = []
            for n, folder in enumerate(level):
                if time.monotonic() > deadline:
                    left.extend(level[n:])
                    return
                try:
                    with os.scandir(folder) as listing:
                        entries = sorted(listing, key=lambda e: e.name)
                except OSError:
                    continue
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False) or inside(entry.path):
                            continue
                        writable = entry.stat(follow_symlinks=False).st_mode & stat.S_IWOTH
                    except OSError:
                        continue
                    if writable and len(found) >= MAX_COVERED:
                        left.append(entry.path)  # said below, with what was not looked at
                    else:
                        (found if writable else below).append(entry.path)
            level = below

    def look() -> None:
        try:
            walk()
        finally:
            done.set()

    thread = threading.Thread(target=look, name="writable-folders", daemon=True)
    thread.start()
    if not done.wait(budget_s + 1.0):  # a folder's listing that never answers: what was found by then
        log.warning("looking for folders any user may write did not end (a hung mount?): only those found are covered")
    if left:
        log.warning(
            "looking for folders any user may write: %d folders were not looked into or not covered (past %.0f s, "
            "or past %d covered: %s...): a folder any user may write among or below them is shared by tasks",
            len(left),
            budget_s,
            MAX_COVERED,
            ", ".join(left[:5]),
        )
    return list(found)


def close_to_others(folders: list[Path], *, reached: list[Path]) -> list[Path]:
    """Each folder made, or kept, the agent's alone (0700) where the agent owns it; those it could not close
    (another owner's and open to others, or unreadable) or must not (`/`, or one holding a folder tasks must reach:
    the data directory with their working folders, Python, the SDK, shared folders) returned."""
    left: list[Path] = []
    ways = [os.path.realpath(p) for p in reached]
    for folder in folders:
        real = os.path.realpath(folder)
        if real == "/" or any(way == real or way.startswith(real.rstrip("/") + "/") for way in ways):
            left.append(folder)
            continue
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(folder)  # a link's folder: the one a task would walk into
            if st.st_uid == os.geteuid():
                if st.st_mode & 0o077:
                    os.chmod(folder, 0o700)
            elif st.st_mode & 0o005:
                left.append(folder)
        except OSError:
            left.append(folder)
    return left


def confinement(
    *,
    users: TaskUsers | None,
    sdk_dir: Path,
    data_dir: Path,
    storage_dirs: list[Path],
    shared_dirs: list[Path],
    cgroups: Cgroups | None = None,
    tmpfs_mb: int = 1024,
    gpu_files: dict[int, GpuFile] | None = None,
) -> Confinement:
    """The task's view of the host: the agent's Python and the SDK reachable, its data and home hidden."""
    python = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    reach = tuple(sorted(python | {str(sdk_dir)} | {str(p) for p in shared_dirs}))
    cover = {str(p.resolve()): 0o755 for p in (data_dir, Path.home(), *storage_dirs) if str(p.resolve()) != "/"}
    cover.update({p: 0o1777 for p in TEMP_DIRS})
    shared = tuple(reach) + tuple(cover)  # shared on purpose, or covered already
    anyones = [p for p in writable_by_anyone(skip=shared) if p not in cover]
    if anyones:  # a warning: an honest job that used one finds it empty, and this says why
        log.warning(
            "folders any user may write, covered in each task's view like /tmp (name one in "
            "TRAINMASTER_TASK_SHARED_DIRS to share it with tasks): %s",
            ", ".join(anyones),
        )
    cover.update({p: 0o1777 for p in anyones})
    return Confinement(
        users=users, reach=reach, cover=cover, tmpfs_bytes=tmpfs_mb * 2**20, cgroups=cgroups, gpu_files=gpu_files or {}
    )
