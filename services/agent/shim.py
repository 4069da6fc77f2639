"""Runs one task command so that it never outlives its agent (standard library only).

The agent forks this (below) or starts it, as the leader of a new process group, with `python -I -S shim.py
<launch file> <agent pid>`: the launch file (0600, read then deleted here) holds the command, its environment and
working directory, and, when the agent runs as root, the task's own uid and gid and the paths it must be able to
reach. The shim stays with the agent's privileges and starts the command as the task's user. The kernel sends SIGUSR2
when its parent (the agent, or the agent's forking server) dies (parent-death signal); the shim then SIGKILLs its
whole group, grandchildren included. The command in turn gets SIGKILL when the shim dies (its own parent-death
signal). A SIGTERM from the agent reaches the whole group directly (one that comes while the task is still being set
up is sent to the group again once the command is in it); the shim waits for the command and exits as the command
did.

The shim first pins itself to the task's CPUs (`cpus` of the launch file; what it starts inherits them). With a task
user, it then joins the task's cgroups (memory, pids and CPU time limits; everything the task starts counts), then
enters mount, IPC and PID namespaces of its own. In the mount namespace every directory on the way to the paths the
task needs (its working directory, the Python and engine environments, the SDK) that the task's user could not enter
is covered by an empty tmpfs showing only the next step of that way; the agent's data directory and home are always
covered, /tmp, /var/tmp, /dev/shm and /run/lock are private tmpfs of bounded size, and /etc/passwd and /etc/group
are copies with an entry for the task's user (so `getpass.getuser()`, `id` and `~` work). A forked copy of the shim
is PID 1 of the task's PID namespace: it mounts a /proc showing only the task's processes, limits the size of any
file the task writes (the disk quota), starts the command, tells the shim how the command ended and reaps orphans
until it is killed with the rest of the group; when it dies, the kernel kills everything left in the namespace.

`shim.py --serve <socket fd> <agent pid>` is the same, forked: the agent starts it once (a Python start and these
imports cost ~60-75 ms of CPU, paid before every task when each task started its own `python -I -S shim.py`); it
reads requests on its end of a Unix socket pair (a launch file, a working directory and the task's standard input,
output and error as passed descriptors), forks a child for each that becomes the task's shim as above (a session
and process group of its own, those descriptors as 0, 1 and 2, nothing else of this process open) and answers with
the child's pid, then with its exit status once it ends. It holds no launch data: a child reads its own launch file.
It dies with the agent (parent-death signal), ends when the agent closes the socket, and a shim it forked dies
with it, so, as before, no task outlives the agent.
"""

import ctypes
import functools
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x20000000, 0x10000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
LIBC = ctypes.CDLL(None, use_errno=True)


# The kernel's keyrings are the uid's, not the process's: a key a task adds to its user keyring outlives it and is
# there for the next task given the same uid (another project's, found by review). A task may not call the key
# management calls at all (as Docker's default profile has it): each answers ENOSYS, as on a kernel without them,
# so libraries fall back (Kerberos to its file cache). A seccomp filter, set in the command's process before exec
# (after no_new_privs); what it starts inherits it. Per architecture: its audit id, then each call's number.
KEY_CALLS = {
    0xC000003E: (248, 249, 250, 0x40000000 + 248, 0x40000000 + 249, 0x40000000 + 250),  # x86_64 (and its x32 ABI)
    0x40000003: (286, 287, 288),  # i386: a 64-bit process may make 32-bit calls (int 0x80)
    0xC00000B7: (217, 218, 219),  # aarch64
    0x40000028: (309, 310, 311),  # 32-bit ARM: an aarch64 host may run it (Graviton2, Altra)
}
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, ENOSYS = 0x7FFF0000, 0x00050000, 38
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def key_call_filter() -> list[tuple[int, int, int, int]]:
    """The BPF program: for each architecture above, its key calls answer ENOSYS; everything else is allowed."""
    program: list[tuple[int, int, int, int]] = []
    deny = (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS)
    allow = (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    for arch, calls in KEY_CALLS.items():
        program.append((BPF_LD_W_ABS, 0, 0, 4))  # seccomp_data.arch
        program.append((BPF_JEQ_K, 0, len(calls) + 3, arch))  # another architecture: on to the next block
        program.append((BPF_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
        for i, call in enumerate(calls):
            program.append((BPF_JEQ_K, len(calls) - i, 0, call))  # this call: to the deny after the block's allow
        program += [allow, deny]
    return [*program, allow]


def forbid_key_calls() -> bool:
    """Set `key_call_filter` on this process (no_new_privs already set); False where the kernel refused it."""
    program = key_call_filter()
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), ctypes.cast(filters, ctypes.POINTER(SockFilter)))
    return LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0


def _check(result: int, what: str = "") -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{os.strerror(errno)}{': ' + what if what else ''}")


def _searchable(path: str, uid: int, gid: int) -> bool:
    st = os.stat(path)
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid == gid else 0o001
    return bool(st.st_mode & bit)


def plan(*, reach: list[str], cover: dict[str, int], uid: int, gid: int) -> dict[str, tuple[int, set[str]]]:
    """Directories to cover (tmpfs mode, the children to show through it) so that `reach` is reachable."""
    covers: dict[str, tuple[int, set[str]]] = {
        os.path.realpath(p): (mode, set()) for p, mode in cover.items() if os.path.isdir(p)
    }
    covers.pop("/", None)
    for target in reach:
        target = os.path.realpath(target)
        if not os.path.exists(target):
            continue
        parts = target.strip("/").split("/")
        for depth in range(1, len(parts)):
            parent, child = "/" + "/".join(parts[:depth]), parts[depth]
            if parent in covers or not _searchable(parent, uid, gid):
                covers.setdefault(parent, (0o755, set()))[1].add(child)
    return covers


def account_files(*, passwd: str, group: str, name: str, uid: int, gid: int, home: str) -> tuple[str, str]:
    """The host's /etc/passwd and /etc/group, less any entry of that name or id, plus one for the task's user."""

    def kept(text: str, number: int) -> str:
        rows = [row for row in text.splitlines() if row.strip()]
        return "".join(
            f"{row}\n"
            for row in rows
            if row.split(":")[0] != name and (row.split(":") + ["", "", ""])[2] != str(number)
        )

    return (
        f"{kept(passwd, uid)}{name}:x:{uid}:{gid}:trainmaster task:{home}:/bin/sh\n",
        f"{kept(group, gid)}{name}:x:{gid}:\n",
    )


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def show_account(*, name: str, uid: int, gid: int, home: str, scratch: str = "/tmp") -> None:
    """Bind generated passwd and group files over the host's, in this mount namespace only (written to the
    task's private `scratch` tmpfs, then unlinked: the mounts keep them)."""
    texts = account_files(
        passwd=_read("/etc/passwd"), group=_read("/etc/group"), name=name, uid=uid, gid=gid, home=home
    )
    for target, text in zip(("/etc/passwd", "/etc/group"), texts):
        source = os.path.join(scratch, f".trainmaster-{os.path.basename(target)}")
        with open(os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
            f.write(text)
        try:
            _check(LIBC.mount(source.encode(), target.encode(), None, MS_BIND, None), f"show {target}")
        finally:
            os.unlink(source)


def isolate(
    covers: dict[str, tuple[int, set[str]]], *, tmpfs_size: int | None = None, sizes: dict[str, int] | None = None
) -> None:
    """In the task's own mount namespace, cover each directory, showing only its listed children (each tmpfs of
    `sizes[directory]`, else `tmpfs_size`, bytes)."""
    _check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None))
    sizes = sizes or {}
    # handles on what each cover hides, taken in the new namespace (a bind mount's source must be in it)
    originals = {
        (parent, child): os.open(os.path.join(parent, child), os.O_PATH | os.O_NOFOLLOW)
        for parent, (_, children) in covers.items()
        for child in children
        if os.path.lexists(os.path.join(parent, child))
    }
    for parent in sorted(covers, key=lambda p: p.count("/")):  # outer first: inner ones are reached through them
        mode, children = covers[parent]
        if not os.path.isdir(parent):  # inside an outer cover and on no path the task needs: hidden already
            continue
        size = sizes.get(parent, tmpfs_size)
        options = f"mode={mode:o}" + (f",size={size}" if size else "")
        _check(
            LIBC.mount(b"tmpfs", parent.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()), f"cover {parent}"
        )
        for child in sorted(children):
            fd = originals.get((parent, child))
            if fd is None:
                continue
            target = os.path.join(parent, child)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target)
            else:
                open(target, "x").close()
            _check(
                LIBC.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None),
                f"show {target}",
            )
    for fd in originals.values():
        os.close(fd)


def join_cgroups(procs_files: list[str], *, joined: str | None = None) -> None:
    """Move this process into the task's cgroups: what it forks from now on is counted against their limits. Once
    in all of them, create `joined` (in the agent's private launch directory, where no task can write): the agent
    then finds the task's processes in its cgroups instead of looking through every process of the host."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    if procs_files and joined:
        os.close(os.open(joined, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def _bind_to(parent: int) -> None:
    """In the command's process, before exec (after its uid changed, which clears the setting): die with its parent,
    and gain no privilege by exec.

    Whatever kills the shim or its PID 1 (the OOM killer, an operator) kills the command with it; the agent then
    kills the rest of the group and every process of the task's uid, so no part of the task runs on alone."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # No set-user-ID or file capability raises what the task or its children run as: a set-user-ID file another
    # task left in a shared directory cannot make this one act as that task's uid (nor can any on the host).
    if LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os.kill(os.getpid(), signal.SIGKILL)  # a kernel that cannot say so: the task does not run
    if not forbid_key_calls():  # a kernel without seccomp filters: the task runs, said so
        os.write(2, b"[trainmaster] the kernel refused the task's seccomp filter: its keyrings are not closed\n")
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


_STOPS: list[int] = []  # SIGTERMs this process heard (a fork keeps those its parent heard before it)


def _heard_stop(signum: int, _frame: object) -> None:
    _STOPS.append(signum)


def init(launch: dict, as_user: dict, *, report: int, own_pids: bool) -> None:
    """PID 1 of the task: a fresh /proc, the command started, its exit status written to `report`, then orphans
    reaped until nothing is left (or the agent kills the group: the namespace dies with its PID 1)."""
    if own_pids:
        try:
            _check(LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
        except OSError as exc:
            if launch.get("user"):  # a task user's view is whole or the task does not run
                raise
            print(f"[trainmaster] the host's processes stay in this task's /proc ({exc})", file=sys.stderr, flush=True)
    if launch.get("file_size"):
        resource.setrlimit(resource.RLIMIT_FSIZE, (launch["file_size"], launch["file_size"]))
    me = os.getpid()
    child = subprocess.Popen(
        ["/bin/sh", "-c", launch["command"]],
        cwd=launch["cwd"],
        env=launch["env"],
        restore_signals=True,
        preexec_fn=lambda: _bind_to(me),
        **as_user,
    )
    if _STOPS:  # asked to stop before the command existed: the group is told again now the command is in it
        os.killpg(os.getpgrp(), signal.SIGTERM)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child.pid:
            os.write(report, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(report)
    os._exit(0)


def confine(launch: dict) -> tuple[dict, bool]:
    """Cgroups, namespaces and the task's account (when it has a user of its own); the arguments that drop to it
    and whether its children get a PID namespace."""
    user = launch.get("user")
    if not user:
        return {}, bool(launch.get("cover")) and confine_own(launch)
    uid, gid = user["uid"], user["gid"]
    counted = bool(launch.get("cgroup_procs"))  # the task's memory, /dev/shm's included, counted by its cgroup
    try:
        join_cgroups(launch.get("cgroup_procs", []), joined=launch.get("cgroup_joined"))
    except OSError as exc:
        counted = False
        print(
            f"[trainmaster] the task's cgroup could not be joined ({exc}): its memory is measured by the agent instead",
            file=sys.stderr,
            flush=True,
        )
    try:  # mount, IPC and (for its children) PID namespaces of its own
        _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID))
        namespaced = True
    except OSError as exc:  # no CAP_SYS_ADMIN: the task still runs as its own user, with less in reach
        print(
            f"[trainmaster] no private mount namespace for this task ({exc}); paths under directories its "
            "user cannot enter are out of its reach",
            file=sys.stderr,
            flush=True,
        )
        namespaced = False
    if namespaced:  # from here on a failure ends the task: it never runs half covered
        shm = {"/dev/shm": launch["shm_size"]} if launch.get("shm_size") and counted else None
        if launch.get("isolated"):  # said in the agent's private launch directory (no task writes there) before
            # the covers hide it: what follows either makes the task's whole view or ends the task before it runs
            os.close(os.open(launch["isolated"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        cover_view(launch, uid=uid, gid=gid, sizes=shm)
        hide_devices(launch.get("hidden") or [])
        try:
            show_account(name=user["name"], uid=uid, gid=gid, home=launch["cwd"])
        except OSError as exc:  # USER, LOGNAME and HOME still name it
            print(f"[trainmaster] no passwd entry for this task ({exc})", file=sys.stderr, flush=True)
    elif launch.get("hidden"):
        print(_UNHIDDEN, file=sys.stderr, flush=True)
    return {"user": uid, "group": gid, "extra_groups": [], "umask": 0o077}, namespaced


_UNHIDDEN = "[trainmaster] the other GPUs' device files are not hidden from this task (no mount namespace of its own)"


def hide_devices(paths: list[str], *, scratch: str = "/tmp") -> None:
    """Bind an empty file of mode 0 (made in the task's private `scratch` tmpfs and unlinked: the mounts keep it)
    over each of `paths` (other GPUs' device files), in this mount namespace only: opening one fails as a device
    file whose permissions refuse it does (a task user's: the file is root's; the agent's own user's, in a user
    namespace: the file is that user's, which may make it readable, an empty file, never the GPU). A path that
    is not there (or a link to nothing) is passed over."""
    if not paths:
        return
    source = os.path.join(scratch, ".trainmaster-hidden")
    os.close(os.open(source, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o000))
    try:
        for path in paths:
            if os.path.exists(path):
                _check(LIBC.mount(source.encode(), path.encode(), None, MS_BIND, None), f"hide {path}")
    finally:
        os.unlink(source)


def enter_own_namespaces(uid: int, gid: int) -> None:
    """A user namespace mapping only this user, with mount, IPC and (for its children) PID namespaces, its mounts
    private (the first mount a host that restricts such namespaces, Ubuntu 24.04's AppArmor, refuses)."""
    _check(LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID), "user namespace")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:  # itself, and no one else: the same uid on the host
            f.write(text)
    _check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")


def passes_in_a_copy(attempt: "Callable[[], None]") -> bool:
    """Whether `attempt` raises nothing in a forked copy of this process, which then exits (whatever it met, the
    copy never returns into the caller's code): namespaces tried without entering them here."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            attempt()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@functools.cache
def own_namespaces_refused(uid: int, gid: int) -> str | None:
    """Why the host gives this user no namespaces of its own, or None: on a host that restricts them the unshare
    itself may pass and what follows fail, leaving a process half in."""
    return None if passes_in_a_copy(lambda: enter_own_namespaces(uid, gid)) else "the host refuses them to this user"


def enter_mount_namespaces() -> None:
    _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID), "mount namespace")
    _check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")


@functools.cache
def mount_namespaces_refused() -> str | None:
    """Why this (root) process may not give a task mount namespaces of its own (no CAP_SYS_ADMIN: a Pod's default);
    None where it may."""
    return None if passes_in_a_copy(enter_mount_namespaces) else "the host refuses them to the agent"


def confine_own(launch: dict) -> bool:
    """A task of an agent that is not root runs as the agent's own user: it could read all the agent can (the
    platform's keys and tokens in its data directory, every other task's folder). In a user namespace of its own
    (the host permitting: most do to any user) it gets the same view of the host as a task user has: mount, IPC and
    PID namespaces, the data directory, home and temporary folders covered, only what it needs shown. Whether it
    got them; where the host refuses, it runs as before, said so."""
    uid, gid = os.getuid(), os.getgid()
    if (refused := own_namespaces_refused(uid, gid)) is not None:
        print(
            f"[trainmaster] no namespaces of its own for this task ({refused}): it runs as the agent's user and "
            "can read what the agent can",
            file=sys.stderr,
            flush=True,
        )
        if launch.get("hidden"):
            print(_UNHIDDEN, file=sys.stderr, flush=True)
        return False
    enter_own_namespaces(uid, gid)  # a forked copy just did: from here on a failure ends the task
    # no cgroup counts /dev/shm: as large as the host's (a DataLoader's workers fill it)
    cover_view(launch, uid=uid, gid=gid, sizes={"/dev/shm": 0})
    hide_devices(launch.get("hidden") or [])
    return True


def cover_view(launch: dict, *, uid: int, gid: int, sizes: dict[str, int] | None) -> None:
    """In the task's mount namespace, its view of the host: the launch's covers over what it may not see, what it
    must reach shown through them, the short TMPDIR link made again in its own /tmp."""
    isolate(
        plan(reach=launch["reach"], cover={k: int(v) for k, v in launch["cover"].items()}, uid=uid, gid=gid),
        tmpfs_size=launch.get("tmpfs_size"),
        sizes=sizes,
    )
    for link, target in launch.get("links", {}).items():
        try:
            os.symlink(target, link)
        except FileExistsError:  # /tmp not covered: the agent's link on the host is the task's
            pass


def pin(cpus: list[int]) -> None:
    """Run on these CPUs only, and so does all the task starts (affinity is inherited): what sizes its threads by
    the CPUs it may use (OpenMP, PyTorch, `os.sched_getaffinity`) sizes them to the task's share. None: unchanged."""
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # a CPU gone offline since the agent looked: the task runs, unpinned
        print(f"[trainmaster] the task could not be pinned to CPUs {cpus} ({exc})", file=sys.stderr, flush=True)


def main(path: str, *, parent: int) -> None:
    """The task of launch file `path`, run to its end; `parent`: the process whose death ends it (the agent, or the
    agent's forking server)."""
    with open(path) as f:
        launch = json.load(f)
    os.unlink(path)
    signal.signal(signal.SIGUSR2, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGUSR2)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os.killpg(os.getpgrp(), signal.SIGKILL)
    # The command gets its own SIGTERM from the group signal; one that comes before the command exists (the agent
    # asked to stop while the task was being set up) is kept and passed on as soon as it does (`init`). Ignored, it
    # reached no process and the task ran on until the stop's grace ran out.
    signal.signal(signal.SIGTERM, _heard_stop)
    pin(launch.get("cpus") or [])
    as_user, namespaced = confine(launch)
    done, report = os.pipe()
    first = os.fork()
    if first == 0:
        os.close(done)
        try:
            init(launch, as_user, report=report, own_pids=namespaced)
        except BaseException:  # the command could not start (its directory gone, say): the task fails with why
            traceback.print_exc()
            sys.stderr.flush()
        os._exit(127)
    os.close(report)
    text = b""
    while chunk := os.read(done, 32):
        text += chunk
    if text:
        code = int(text)
    else:  # PID 1 died before the command ended (killed): the task ends as it did
        _, status = os.waitpid(first, 0)
        code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def serve(channel: int, *, agent: int) -> int:
    """The forking server (module docstring): requests on socket `channel` until the agent closes it."""
    import select
    import socket

    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != agent:  # the agent died before the signal was armed
        return 1
    if os.geteuid() != 0:  # tried once here, and known to every task this server forks (`confine_own`)
        own_namespaces_refused(os.getuid(), os.getgid())
    sock = socket.socket(fileno=channel)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's end wakes the select below
    me = os.getpid()
    children: set[int] = set()  # forked and not yet reaped: their pids cannot name another process
    try:
        while True:
            try:
                ready, _, _ = select.select([sock.fileno(), wake_read], [], [])
            except InterruptedError:
                continue
            if wake_read in ready:
                os.read(wake_read, 4096)
                for pid, code in _reaped():
                    children.discard(pid)
                    sock.send(f"exited {pid} {code}".encode())
            if sock.fileno() in ready:
                data, fds, _, _ = socket.recv_fds(sock, 65536, 3)
                if not data:  # the agent closed its end (it is gone): the shims forked here die with this process
                    return 0
                if answer := _handle(data, fds, parent=me, children=children):
                    sock.send(answer.encode())
    except OSError:  # the agent's end is gone
        return 0


def _handle(data: bytes, fds: list[int], *, parent: int, children: set[int]) -> str:
    """One request: `{"kill": pid}` (a shim whose launch was cancelled: killed with its group if it is still a child
    here, never a pid reused by another process; no answer), else a shim to fork (`_fork_shim`)."""
    try:
        request = json.loads(data)
        victim = int(request["kill"]) if isinstance(request, dict) and "kill" in request else None
    except (ValueError, TypeError):
        request, victim = None, None
    if victim is None:
        answer, pid = _fork_shim(request if isinstance(request, dict) else {}, fds, parent=parent)
        if pid is not None:
            children.add(pid)
        return answer
    for fd in fds:
        os.close(fd)
    if victim in children:
        for kill in (os.kill, os.killpg):  # the group once it has made it
            try:
                kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return ""


def _reaped() -> list[tuple[int, int]]:
    """The children that ended (pid, exit status as `subprocess` reports it: -N for signal N), reaped."""
    ended: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, os.waitstatus_to_exitcode(status)))


def _fork_shim(request: dict, fds: list[int], *, parent: int) -> tuple[str, int | None]:
    """Fork the shim of one request (`{"id", "launch", "cwd"}` and three descriptors): the answer to send and the
    child's pid (None where none was forked). The child gets only what was read here (a fault reading the request
    there would run this loop in the child)."""
    try:
        try:
            ident, launch, cwd = int(request["id"]), str(request["launch"]), str(request["cwd"])
        except (ValueError, KeyError, TypeError):
            return "refused 0 malformed request", None
        if len(fds) != 3:
            return f"refused {ident} expected 3 descriptors, got {len(fds)}", None
        try:
            pid = os.fork()
        except OSError as exc:
            return f"refused {ident} {exc}", None
        if pid == 0:
            _become_shim(launch, cwd, fds, parent=parent)  # never returns
        return f"started {ident} {pid}", pid
    finally:
        for fd in fds:  # the child holds its own copies
            os.close(fd)


def _close_from(low: int) -> None:
    """Close every descriptor from `low` up: those /proc lists (a `closerange` to the descriptor limit is a close a
    descriptor on a kernel without `close_range`, a million where the limit is that high), else all of them."""
    try:
        found = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        return
    for fd in found:
        if fd >= low:
            try:
                os.close(fd)
            except OSError:  # the listing's own descriptor, closed already
                pass


def _become_shim(launch: str, cwd: str, fds: list[int], *, parent: int) -> None:
    """In a forked child of the server: the task's shim, as if the agent had started `python -I -S shim.py`."""
    code = 127
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        _close_from(3)  # the server's socket and pipe: nothing of the server (nor of another task) stays open
        os.chdir(cwd)
        main(launch, parent=parent)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # the command could not start (its directory gone, say): the task fails with why
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.exit(serve(int(sys.argv[2]), agent=int(sys.argv[3])))
    main(sys.argv[1], parent=int(sys.argv[2]))
