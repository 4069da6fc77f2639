"""Runs one task command so that it never outlives its agent (standard library only).

The agent starts this as the leader of a new process group, with `python -I shim.py <launch file>`: the launch
file (0600, read then deleted here) holds the command, its environment and working directory, and, when the agent
runs as root, the task's own uid and gid and the paths it must be able to reach. The shim stays with the agent's
privileges and starts the command as the task's user. The kernel sends SIGUSR2 when the agent dies (parent-death
signal); the shim then SIGKILLs its whole group, grandchildren included. The command in turn gets SIGKILL when the
shim dies (its own parent-death signal). A SIGTERM from the agent reaches the whole group directly; the shim waits
for the command and exits as the command did.

With a task user, the shim first enters a mount namespace of its own in which every directory on the way to the
paths the task needs (its working directory, the Python and engine environments, the SDK) that the task's user
could not enter is covered by an empty tmpfs showing only the next step of that way; the agent's data directory
and home are always covered, and /tmp, /var/tmp and /dev/shm are private to the task.
"""
import ctypes
import json
import os
import signal
import stat
import subprocess
import sys

PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
LIBC = ctypes.CDLL(None, use_errno=True)


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
    covers = {os.path.realpath(p): (mode, set()) for p, mode in cover.items() if os.path.isdir(p)}
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


def isolate(covers: dict[str, tuple[int, set[str]]]) -> None:
    """Enter a private mount namespace and cover each directory, showing only its listed children."""
    _check(LIBC.unshare(CLONE_NEWNS))
    _check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None))
    # handles on what each cover hides, taken in the new namespace (a bind mount's source must be in it)
    originals = {(parent, child): os.open(os.path.join(parent, child), os.O_PATH | os.O_NOFOLLOW)
                 for parent, (_, children) in covers.items() for child in children
                 if os.path.lexists(os.path.join(parent, child))}
    for parent in sorted(covers, key=lambda p: p.count("/")):  # outer first: inner ones are reached through them
        mode, children = covers[parent]
        if not os.path.isdir(parent):  # inside an outer cover and on no path the task needs: hidden already
            continue
        _check(LIBC.mount(b"tmpfs", parent.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode:o}".encode()),
               f"cover {parent}")
        for child in sorted(children):
            fd = originals.get((parent, child))
            if fd is None:
                continue
            target = os.path.join(parent, child)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target)
            else:
                open(target, "x").close()
            _check(LIBC.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None),
                   f"show {target}")
    for fd in originals.values():
        os.close(fd)


def _bind_to(shim: int) -> None:
    """In the command's process, before exec (after its uid changed, which clears the setting): die with the shim.

    Whatever kills the shim (the OOM killer, an operator) kills the command with it; the agent then kills the rest
    of the group and every process of the task's uid, so no part of the task runs on without its shim."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != shim:  # the shim died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    with open(sys.argv[1]) as f:
        launch = json.load(f)
    os.unlink(sys.argv[1])
    signal.signal(signal.SIGUSR2, lambda *_: os.killpg(os.getpgrp(), signal.SIGKILL))
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGUSR2)
    if os.getppid() == 1:  # the agent died before the signal was armed
        os.killpg(os.getpgrp(), signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the command gets its own SIGTERM from the group signal
    user = launch.get("user")
    as_user = {}
    if user:
        uid, gid = user["uid"], user["gid"]
        try:
            isolate(plan(reach=launch["reach"], cover={k: int(v) for k, v in launch["cover"].items()},
                         uid=uid, gid=gid))
        except OSError as exc:  # no CAP_SYS_ADMIN: the task still runs as its own user, with less in reach
            print(f"[trainmaster] no private mount namespace for this task ({exc}); paths under directories its "
                  "user cannot enter are out of its reach", file=sys.stderr, flush=True)
        as_user = {"user": uid, "group": gid, "extra_groups": [], "umask": 0o077}
    shim = os.getpid()
    child = subprocess.Popen(["/bin/sh", "-c", launch["command"]], cwd=launch["cwd"], env=launch["env"],
                             restore_signals=True, preexec_fn=lambda: _bind_to(shim), **as_user)
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
