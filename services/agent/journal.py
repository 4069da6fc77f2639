"""What this agent has ever started, reported ended, or been told to skip, kept on disk so a restarted agent
never reruns a task and reports the end of those its previous run took down with it."""

import json
import logging
import os
from pathlib import Path
from typing import IO

from shared.buscreds import write_secret

log = logging.getLogger(__name__)

KINDS = ("started", "stopped", "exited", "fenced")


class Journal:
    """A snapshot (one JSON document, the file's first line) and the marks made since, one JSON line each, appended
    and synced: a mark costs one short write, not a rewrite of every task the node ever ran (the snapshot used to be
    rewritten and synced at every mark, two a task, so a node's CPU a task grew with its history). Once the lines
    outnumber the snapshot's tasks (and `compact_after`), the snapshot is written again with them (to a temporary
    file, synced, then renamed over the journal). A line cut short by a crash is the last one: it is left out."""

    def __init__(self, path: Path, *, compact_after: int = 1024) -> None:
        self.path, self.compact_after = path, compact_after
        self.started: set[str] = set()
        self.stopped: set[str] = set()
        self.exited: set[str] = set()
        self.fenced: set[str] = set()  # started tasks the agent stopped itself, its heartbeats unacknowledged
        self._appended = 0  # lines since the snapshot
        self._file: IO[str] | None = None
        if path.exists():
            self._load(path.read_text())

    def _load(self, text: str) -> None:
        first, *marks = text.split("\n")
        data = json.loads(first)
        self.started, self.stopped = set(data["started"]), set(data["stopped"])
        # journals written before ends were kept: every started task counts as reported
        self.exited = set(data.get("exited", data["started"]))
        self.fenced = set(data.get("fenced", []))
        for n, line in enumerate(marks):
            if not line.strip():
                continue
            try:
                mark = json.loads(line)
                if mark["kind"] not in KINDS:
                    raise ValueError(mark["kind"])
                getattr(self, mark["kind"]).add(str(mark["key"]))
            except (ValueError, KeyError, TypeError):
                if n < len(marks) - 1:  # not a write cut short by a crash: say so, keep reading
                    log.warning("journal %s: line %d is not a mark, left out: %r", self.path, n + 2, line[:200])
                continue
            self._appended += 1

    @staticmethod
    def key(job_id: str, attempt: int, rank: int) -> str:
        return f"{job_id}:{attempt}:{rank}"

    def mark_started(self, key: str) -> None:
        self._mark("started", key)

    def mark_stopped(self, key: str) -> None:
        self._mark("stopped", key)

    def mark_fenced(self, key: str) -> None:
        self._mark("fenced", key)

    def mark_exited(self, key: str) -> None:
        self._mark("exited", key)

    def unreported(self) -> list[tuple[str, int, int]]:
        """(job id, attempt, rank) of tasks started and never reported ended: a previous run of the agent died
        with them (its tasks die with it)."""
        keys = sorted(self.started - self.exited - self.stopped)
        return [(job_id, int(attempt), int(rank)) for job_id, attempt, rank in (k.rsplit(":", 2) for k in keys)]

    def _mark(self, kind: str, key: str) -> None:
        marks: set[str] = getattr(self, kind)
        if key in marks:
            return
        marks.add(key)
        if self._file is None and not self.path.exists():
            self._save()
            return
        if self._appended >= max(self.compact_after, len(self.started)):
            self._save()
            return
        if self._file is None:
            os.chmod(self.path, 0o600)  # an older version's journal was 0644
            self._file = self.path.open("a")
            if not _ends_a_line(self.path):  # an older journal's snapshot, or a line a crash cut short: ended
                self._file.write("\n")
        self._file.write(json.dumps({"kind": kind, "key": key}) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._appended += 1

    def _save(self) -> None:
        """The whole journal as a new snapshot, in its place at once (renamed over it once synced), the agent's
        alone (0600: its job ids name other projects' attempt folders)."""
        snapshot = json.dumps({kind: sorted(getattr(self, kind)) for kind in KINDS}) + "\n"
        write_secret(self.path, snapshot, private_folder=False)
        if self._file is not None:  # it appended to the file just replaced
            self._file.close()
            self._file = None
        self._appended = 0


def _ends_a_line(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return True
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
