"""Looks for what an earlier task of its uid could have left: System V segments, files in the temporary dirs."""

import json
import os
from pathlib import Path

uid = str(os.getuid())
rows = [line.split() for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
home = os.environ["HOME"]
files = [
    os.path.join(d, n)
    for d in ("/run/lock", "/dev/shm", "/tmp", "/var/tmp")
    if os.path.isdir(d)
    for n in os.listdir(d)
    if not home.startswith(os.path.join(d, n) + "/")  # the way to its own directory
    and os.path.join(d, n) != os.environ["TMPDIR"]  # its TMPDIR: a link into its own directory
]
print(
    "FOUND " + json.dumps({"uid": os.getuid(), "shm": [r[1] for r in rows if uid in (r[7], r[9])], "files": files}),
    flush=True,
)
print("DONE", flush=True)
