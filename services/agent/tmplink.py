"""A short name for a task's temporary directory.

A task's `TMPDIR` is its own `tmp/` in its working directory (on disk, counted in its quota, private to it). That
path is long (`<data dir>/jobs/<job id>/attempt-N-rank-R/tmp`), and a Unix socket's path holds at most 107 bytes:
Python's multiprocessing makes its sockets under `TMPDIR` (`pymp-*/listener-*`), so every PyTorch DataLoader
with worker processes hung on its first batch ("AF_UNIX path too long" in a worker, seen on the first real-GPU run,
2026-11-27). The task's `TMPDIR` is therefore `/tmp/tm-<16 hex>`, a symbolic link to that directory: on the host,
made by the agent, and inside the task's private `/tmp` (where it has one), made by the shim. The kernel follows
the link when it binds a socket, so the socket lies in the task's own directory under a short name.
"""

import hashlib
import os
import secrets
from pathlib import Path

LINK_DIR = Path("/tmp")  # the directory every task sees (its private one, or the host's)
RANDOM_TRIES = 3


def link_name(target: Path, *, under: Path | None = None) -> Path:
    """The link's name for `target` (in `under`, else LINK_DIR): the same after an agent restart, so a restarted
    agent finds it."""
    return (under or LINK_DIR) / f"tm-{hashlib.sha256(str(target).encode()).hexdigest()[:16]}"


def ours(link: Path, target: Path) -> bool:
    """Whether `link` is a link of this user's to `target` (someone else's file of that name is left alone)."""
    try:
        return link.is_symlink() and os.readlink(link) == str(target) and link.lstat().st_uid == os.getuid()
    except OSError:
        return False


def make(target: Path, *, under: Path | None = None) -> Path | None:
    """A link in `under` to `target`: its usual name, or a random one where another user's file has that name;
    None where none can be made (the task's `TMPDIR` then stays `target`)."""
    under = under or LINK_DIR
    names = [link_name(target, under=under)] + [under / f"tm-{secrets.token_hex(8)}" for _ in range(RANDOM_TRIES)]
    for name in names:
        try:
            os.symlink(target, name)
            return name
        except FileExistsError:
            if ours(name, target):  # an earlier attempt's of this same directory (an agent restarted)
                return name
        except OSError:
            return None
    return None


def remove(link: Path, target: Path) -> None:
    """Remove the link once the task has ended, if it is still ours."""
    if ours(link, target):
        try:
            link.unlink()
        except FileNotFoundError:
            pass


def forget_links(attempts: list[Path]) -> None:
    """The links of attempts an earlier run of the agent left (their tasks died with it)."""
    for attempt in attempts:
        remove(link_name(attempt / "tmp"), attempt / "tmp")
