"""Following a job to its end: its output on stdout, a live progress bar with the ETA, its outcome as exit code."""

import sys
import threading
import time
from typing import TextIO

from services.cli import render
from services.cli.client import Api, CliError

POLL_S = 1.0
EXIT_TERMINATED = 143  # as a shell reports a process ended by SIGTERM


def job_exit(job: dict) -> int:
    """0 when Completed; a failed task's own exit code (else 1) when Failed; 143 when Terminated."""
    phase = job["status"]["phase"]
    if phase == "Completed":
        return 0
    if phase == "Terminated":
        return EXIT_TERMINATED
    codes = [t.get("exit_code") for t in job["status"].get("task_statuses") or []]
    failed = [c for c in codes if c]
    return min(max(failed[0], 1), 255) if failed else 1


class Bar:
    """One status line: the progress bar redrawn in place on a terminal, printed when it changes otherwise; with
    full=False (output piped, no --progress) only a line for each change of phase."""

    def __init__(self, out: TextIO, *, full: bool = True) -> None:
        self.out, self.full, self.last, self.lock = out, full, "", threading.Lock()
        self.tty = full and out.isatty()

    def show(self, job: dict) -> None:
        line = render.safe(render.bar(job) if self.full else render.phase_line(job))
        with self.lock:
            if self.tty:
                self.out.write("\r\033[K" + line)
            elif line.split("elapsed")[0] != self.last.split("elapsed")[0]:
                self.out.write(line + "\n")
            self.out.flush()
            self.last = line

    def above(self, text: str, stream: TextIO) -> None:
        """Write output lines above the bar without tearing it (both usually share one terminal)."""
        with self.lock:
            if self.tty:
                self.out.write("\r\033[K")
                self.out.flush()
            stream.write(text)
            stream.flush()
            if self.tty and self.last:
                self.out.write(self.last)
                self.out.flush()

    def done(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def wait_finished(api: Api, path: str, *, bar: Bar | None, stop: threading.Event | None = None) -> dict:
    while True:
        job = api.call("GET", path)
        if bar:
            bar.show(job)
        if job["status"]["phase"] in render.FINISHED or (stop and stop.is_set()):
            return job
        time.sleep(POLL_S)


def cost(api: Api, path: str, job: dict) -> float | None:
    """What billing charged the job so far (every attempt); None when it cannot say."""
    try:
        report = api.call("GET", path.split("/training-jobs/")[0] + "/usage", params={"job_id": job["metadata"]["id"]})
        return float(report["total"]["cost"])
    except (CliError, KeyError, TypeError, ValueError):
        return None


def finish(api: Api, path: str, job: dict, out: TextIO) -> int:
    """The closing line (final phase, cost, exit code); returns the exit code."""
    code = job_exit(job)
    out.write(render.safe(render.closing_line(job, cost=cost(api, path, job), exit_code=code)) + "\n")
    out.flush()
    return code


def watch(api: Api, path: str) -> int:
    bar = Bar(sys.stdout)
    job = wait_finished(api, path, bar=bar)
    bar.done()
    return finish(api, path, job, sys.stderr)


def logs(api: Api, path: str, *, task: str, progress: bool, raw: bool | None = None) -> int:
    """Stream the output until the job ends; the status line (the bar, or with progress=False one line per phase)
    and the closing line go to stderr so stdout stays the job's own output (as sent with `raw`, else its control
    characters shown escaped: `render.safe_output`; by default raw where stdout is no terminal)."""
    raw = not sys.stdout.isatty() if raw is None else raw  # to a file or a pipe as printed, to a terminal made safe
    bar = Bar(sys.stderr, full=progress)
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(api, path, bar, stop), daemon=True)
    poller.start()
    try:
        for line in api.stream(f"{path}/logs", follow="true", task=task):
            bar.above((line if raw else render.safe_output(line)) + "\n", sys.stdout)
    finally:
        stop.set()
        poller.join(timeout=5)  # no status line after the closing one
    job = wait_finished(api, path, bar=bar)
    bar.done()
    return finish(api, path, job, sys.stderr)


def _poll(api: Api, path: str, bar: Bar, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            bar.show(api.call("GET", path))
        except CliError:
            pass
        stop.wait(POLL_S)
