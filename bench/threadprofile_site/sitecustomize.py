"""Loaded at start by every Python process of a benchmark's stack when `bench.submit --thread-profile DIR` puts this
folder first on their PYTHONPATH (`bench/threadprofile.py`): a cProfile of the process's main thread, timed by that
thread's own CPU (`time.thread_time`, not wall time: a process waiting for a core, or in a system call that sleeps,
adds nothing), started by SIGUSR2 and written to DIR/<pid>.prof by SIGUSR1. Nothing happens without the variable."""

import os

_FOLDER = os.environ.get("TRAINMASTER_BENCH_THREAD_PROFILE")
if _FOLDER:
    import cProfile
    import signal
    import time

    _PROFILE = cProfile.Profile(time.thread_time)

    def _start(*_: object) -> None:
        _PROFILE.enable()

    def _stop(*_: object) -> None:
        _PROFILE.disable()
        path = os.path.join(_FOLDER, f"{os.getpid()}.prof")
        _PROFILE.dump_stats(path + ".part")
        os.replace(path + ".part", path)  # whole when it appears

    signal.signal(signal.SIGUSR2, _start)
    signal.signal(signal.SIGUSR1, _stop)
