"""Each stack on a host gets a uid range of its own, so no task of one stack ever runs as a uid another stack's
task had: the ranges are recorded by data directory in a host-wide registry (a JSON file under a lock)."""

import fcntl
import grp
import json
import os
import pwd
from collections.abc import Iterable
from pathlib import Path

from shared.nodes import TASK_UID_FLOOR

FIRST_UID = TASK_UID_FLOOR
LAST_UID = 2**31 - 2  # uids above are treated as invalid by some tools
SUBORDINATE_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))

Span = tuple[int, int]  # ids from the first up to, not including, the second


def account_uids() -> set[int]:
    """The uids of the host's accounts and the gids of its groups, as enumerated (a task must never run as a
    person's or a daemon's uid, nor with a group's gid). A directory service (sssd, LDAP, winbind) enumerates none
    by default: docs/security.md says to set the range by hand on such hosts."""
    return {entry.pw_uid for entry in pwd.getpwall()} | {entry.gr_gid for entry in grp.getgrall()}


def subordinate_spans(files: Iterable[Path] = SUBORDINATE_FILES) -> list[Span]:
    """The subordinate id ranges handed to users (`/etc/subuid`, `/etc/subgid`: a rootless container's processes
    run as these ids, so a task given one could signal them or read their files); a line that is not
    `name:first:count` is passed over."""
    spans = []
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.strip().split(":")
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit() and int(parts[2]) > 0:
                spans.append((int(parts[1]), int(parts[1]) + int(parts[2])))
    return spans


def host_spans(accounts: Iterable[int] = (), spans: Iterable[Span] = ()) -> list[Span]:
    return sorted([(uid, uid + 1) for uid in accounts] + list(spans))


def accounts_within(first: int, count: int, accounts: Iterable[int], spans: Iterable[Span] = ()) -> list[int]:
    """The first id of each account or subordinate range that overlaps `count` ids from `first`."""
    return [start for start, end in host_spans(accounts, spans) if start < first + count and first < end]


def choose_first(
    taken: dict[str, list[int]],
    *,
    key: str,
    count: int,
    base: int = FIRST_UID,
    accounts: Iterable[int] = (),
    spans: Iterable[Span] = (),
) -> int:
    """The first uid of `key`'s range: the one it has, else the lowest `count` uids from `base` that no range, no
    account of the host and no subordinate range overlaps (one made inside a range since moves that range)."""
    held = [span for span in host_spans(accounts, spans) if span[1] > base]
    if key in taken and taken[key][1] == count and not accounts_within(taken[key][0], count, (), held):
        return taken[key][0]
    others = sorted([(first, first + size) for name, (first, size) in taken.items() if name != key] + held)
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
        first = choose_first(taken, key=key, count=count, accounts=account_uids(), spans=subordinate_spans())
        taken[key] = [first, count]
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(taken, indent=1).encode())
        return first
    finally:
        os.close(fd)
