"""Where each Python process of a stack spends its own CPU over a window, by function: a cProfile of each process's
main thread timed by that thread's CPU (`bench/threadprofile_site/sitecustomize.py`, started and stopped by signals).
py-spy (`bench.cpuprofile`) samples wall time: on a machine whose cores are all busy it counts a thread waiting for a
core, or in `fsync`, as running (the agent's journal sync looked like 9% of the agent; it is 0.07 ms of CPU a mark).
cProfile's own cost inflates pure-Python code (about 2-3x), so the report gives shares, not milliseconds: which
functions and libraries hold a process's CPU. `bench.submit --thread-profile DIR` uses it over a burst. Worker
threads (the agent's `asyncio.to_thread` work) are not in it: their CPU is the process's total less this."""

import os
import pstats
import signal
import time
from pathlib import Path

from bench import cpuprofile

SITE = Path(__file__).resolve().parent / "threadprofile_site"
VARIABLE = "TRAINMASTER_BENCH_THREAD_PROFILE"
BUILT_IN = "built-in calls (system calls, sockets, C encoders)"


def env(folder: Path, pythonpath: str) -> dict[str, str]:
    """The variables a stack's processes get for it: the site folder first on their path, the folder to write to."""
    folder.mkdir(parents=True, exist_ok=True)
    return {VARIABLE: str(folder.resolve()), "PYTHONPATH": os.pathsep.join([str(SITE), pythonpath])}


def signal_all(pids: dict[str, int], sig: int) -> None:
    for pid in pids.values():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def start(pids: dict[str, int]) -> None:
    signal_all(pids, signal.SIGUSR2)


def stop(pids: dict[str, int], folder: Path, *, timeout_s: float = 30) -> dict[str, Path]:
    """Each process's profile file, once written (a process gone, or too busy to write in time, is left out)."""
    signal_all(pids, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    written: dict[str, Path] = {}
    while time.monotonic() < deadline and len(written) < len(pids):
        for name, pid in pids.items():
            path = folder / f"{pid}.prof"
            if name not in written and path.exists():  # renamed into place once whole
                written[name] = path
        time.sleep(0.2)
    return written


def summarize(path: Path, *, top: int = 12) -> dict:
    """A process's main-thread CPU as the profile measured it (seconds, inflated by the profiler), its shares by
    library (`cpuprofile.KINDS`, the innermost frame: a function's own time) and its functions with the most own
    time and the most time within them (shares of the whole)."""
    try:
        stats = pstats.Stats(str(path))
    except TypeError:  # nothing ran on the main thread over the window (pstats refuses an empty profile)
        return {"profiled_cpu_s": 0.0}
    total = stats.total_tt or 1e-9  # type: ignore[attr-defined]
    by_kind: dict[str, float] = {}
    own: list[tuple[float, str]] = []
    within: list[tuple[float, str]] = []
    for (file, line, name), (_cc, _nc, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        frame = f"{name} ({file}:{line})"
        kind = BUILT_IN if file == "~" else cpuprofile.kind_of([frame])
        by_kind[kind] = by_kind.get(kind, 0.0) + tottime
        own.append((tottime, frame))
        within.append((cumtime, frame))

    def shares(rows: list[tuple[float, str]]) -> list[list]:
        return [[frame, round(seconds / total, 3)] for seconds, frame in sorted(rows, reverse=True)[:top]]

    return {
        "profiled_cpu_s": round(total, 2),
        "by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top_own": shares(own),
        "top_within": shares([row for row in within if "services/" in row[1] or "shared/" in row[1]]),
    }
