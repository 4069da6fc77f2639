"""Each stack on a host gets a uid range of its own, so no task of one stack ever runs as a uid another stack's
task had: the ranges are recorded by data directory in a host-wide registry (a JSON file under a lock)."""

import fcntl
import json
import os
import pwd
from collections.abc import Iterable
from pathlib import Path

FIRST_UID = 200_000
LAST_UID = 2**31 - 2  # uids above are treated as invalid by some tools


def account_uids() -> set[int]:
    """The uids of the host's accounts (a task must never run as a person's or a daemon's uid)."""
    return {entry.pw_uid for entry in pwd.getpwall()}


def accounts_within(first: int, count: int, accounts: Iterable[int]) -> list[int]:
    return sorted(uid for uid in accounts if first <= uid < first + count)


def choose_first(
    taken: dict[str, list[int]], *, key: str, count: int, base: int = FIRST_UID, accounts: Iterable[int] = ()
) -> int:
    """The first uid of `key`'s range: the one it has, else the lowest `count` uids from `base` that no range and
    no account of the host overlaps (an account made inside a range since moves that range)."""
    accounts = set(accounts)
    if key in taken and taken[key][1] == count and not accounts_within(taken[key][0], count, accounts):
        return taken[key][0]
    others = sorted(
        [(first, first + size) for name, (first, size) in taken.items() if name != key]
        + [(uid, uid + 1) for uid in accounts if uid >= base]
    )
    first = base
    for start, end in others:
        if first + count <= start:
            break
        first = max(first, end)
    if first + count - 1 > LAST_UID:
        raise ValueError(f"no free range of {count} task uids left on this host")
    return first


def claim_range(registry: Path, *, data_dir: Path, count: int) -> int:
    """The first uid of this stack's range (by its data directory), recorded in `registry` for every stack."""
    registry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = str(data_dir.resolve())
    fd = os.open(registry, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 1 << 22).decode() or "{}"
        taken = {name: span for name, span in json.loads(text).items() if name == key or os.path.isdir(name)}
        first = choose_first(taken, key=key, count=count, accounts=account_uids())
        taken[key] = [first, count]
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(taken, indent=1).encode())
        return first
    finally:
        os.close(fd)
