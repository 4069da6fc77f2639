"""Holds `argv[1]` MB in a detached process (out of the task's process group, its parent gone) for two seconds."""

import os
import sys
import time

done, report = os.pipe()
if os.fork() == 0:
    os.close(done)
    os.setsid()
    if os.fork() == 0:
        held = [bytearray(16 * 2**20) for _ in range(int(sys.argv[1]) // 16)]  # 16 MB steps, each written
        os.write(report, b"held")
        time.sleep(2)
    os._exit(0)
os.close(report)
got = b""
while chunk := os.read(done, 16):  # until the detached process ends
    got += chunk
print("held" if got == b"held" else "lost the memory holder", flush=True)
print("DONE", flush=True)
sys.exit(0 if got == b"held" else 1)
