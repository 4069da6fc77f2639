"""Leaves a System V shared-memory segment and files in /run/lock and /dev/shm behind, then exits."""

import ctypes
import json
import os

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0x7E57, 4096, 0o1000 | 0o600)  # IPC_CREAT
ctypes.memmove(libc.shmat(shmid, None, 0), b"tenant A's secret", 17)
for path in ("/run/lock/left-by-a", "/dev/shm/left-by-a"):
    with open(path, "w") as f:
        f.write("tenant A's secret")
print("LEFT " + json.dumps({"uid": os.getuid(), "shmid": shmid}), flush=True)
print("DONE", flush=True)
