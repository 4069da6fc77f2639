"""Writes `argv[1]` MB to its working directory, 10 MB a file."""

import os
import sys
import time

for i in range(int(sys.argv[1]) // 10):
    with open(os.path.join(os.environ["TRAINMASTER_WORK_DIR"], f"part-{i}"), "wb") as f:
        f.write(b"\1" * (10 * 2**20))
    time.sleep(0.1)
print("DONE", flush=True)
