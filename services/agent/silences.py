"""The node's silences on disk (`fence.Fence.silences`): how many there were, and when the last heartbeat the bus
acknowledged was sent (wall clock, the only clock that outlives a process). A restarted agent continues the count;
the time since that heartbeat is a silence of its own when it reaches the window. Every doubt counts as silence (an
unreadable file, a clock gone backwards); only a node's first run, with no file yet, starts from nothing. Written
without fsync: a write lost in a crash leaves an older heartbeat behind, which only makes the gap longer."""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

UNKNOWN_S = 1e9  # the gap after a heartbeat never recorded: longer than any window


@dataclass(frozen=True)
class Heard:
    silences: int = 0
    acked_wall: float | None = None  # Unix seconds when the last acknowledged heartbeat was sent


def load(path: Path) -> Heard | None:
    """What the previous run left; None on the node's first run (no file); every doubt when it is not what this
    module wrote."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        silences, acked = data["silences"], data["acked_wall"]
    except (OSError, ValueError, KeyError, TypeError):
        return Heard()
    valid = isinstance(silences, int) and silences >= 0 and isinstance(acked, int | float) and math.isfinite(acked)
    return Heard(silences, float(acked)) if valid else Heard()


def unheard_for_s(heard: Heard, *, now_wall: float) -> float:
    """How long ago the last acknowledged heartbeat was sent; UNKNOWN_S when unknown or in the future."""
    if heard.acked_wall is None or heard.acked_wall > now_wall:
        return UNKNOWN_S
    return now_wall - heard.acked_wall


def save(path: Path, heard: Heard) -> None:
    """Replace the file at once (never a torn one), 0600 like everything in the agent's directory."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"silences": heard.silences, "acked_wall": heard.acked_wall}, f)
    tmp.replace(path)
