"""Reads every command line its /proc shows, looking for another task's (the marker comes in two halves)."""

import glob
import json
import sys
from pathlib import Path

marker = sys.argv[1] + sys.argv[2]
lines = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        lines.append(Path(path).read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    except OSError:
        pass
print("PROCS " + json.dumps({"count": len(lines), "seen": [line for line in lines if marker in line]}), flush=True)
print("DONE", flush=True)
