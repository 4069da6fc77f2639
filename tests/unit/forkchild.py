"""A process the fork server tests start (`python -m tests.unit.forkchild MODE ...`): it reports what it was given
as one JSON line on its output, then exits with status 3, or sleeps until it is signalled."""

import json
import os
import sys
import time

if __name__ == "__main__":
    umask = os.umask(0)
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                "umask": umask,
                "session": os.getsid(0) == os.getpid(),
                "main": __name__,
                "stdin": sys.stdin.read(),
                "frozen_preloaded": "faststream" in sys.modules,
            }
        ),
        flush=True,
    )
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(3)
