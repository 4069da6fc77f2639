"""The host's mounts as /proc/self/mountinfo lists them (pure parsing; the file read where asked)."""

from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")


def mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each well-formed line of mountinfo's text (a space in a mount point is
    written `\\040` there)."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split(" - ", 1)
        head = fields[0].split()
        if len(fields) != 2 or len(head) < 5 or not fields[1].split():
            continue
        found.append((head[4].replace("\\040", " "), fields[1].split()[0]))
    return found


def read_mountinfo() -> str:
    """This process's mountinfo's text; empty where it cannot be read."""
    try:
        return MOUNTINFO.read_text()
    except OSError:
        return ""
