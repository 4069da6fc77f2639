"""Each stack on a host gets a uid range of its own, so no task of one stack ever runs as a uid another stack's
task had: the ranges are recorded by data directory in a host-wide registry (a JSON file under a lock)."""

import fcntl
import json
import os
from pathlib import Path

FIRST_UID = 200_000
LAST_UID = 2**31 - 2  # uids above are treated as invalid by some tools


def choose_first(taken: dict[str, list[int]], *, key: str, count: int, base: int = FIRST_UID) -> int:
    """The first uid of `key`'s range: the one it has, else the lowest `count` uids from `base` no range overlaps."""
    if key in taken and taken[key][1] == count:
        return taken[key][0]
    others = sorted((first, first + size) for name, (first, size) in taken.items() if name != key)
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
        first = choose_first(taken, key=key, count=count)
        taken[key] = [first, count]
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(taken, indent=1).encode())
        return first
    finally:
        os.close(fd)
