"""What this agent has ever started, reported ended, or been told to skip, kept on disk so a restarted agent
never reruns a task and reports the end of those its previous run took down with it."""

import json
import os
from pathlib import Path


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started: set[str] = set()
        self.stopped: set[str] = set()
        self.exited: set[str] = set()
        self.fenced: set[str] = set()  # started tasks the agent stopped itself, its heartbeats unacknowledged
        if path.exists():
            data = json.loads(path.read_text())
            self.started, self.stopped = set(data["started"]), set(data["stopped"])
            # journals written before ends were kept: every started task counts as reported
            self.exited = set(data.get("exited", data["started"]))
            self.fenced = set(data.get("fenced", []))

    @staticmethod
    def key(job_id: str, attempt: int, rank: int) -> str:
        return f"{job_id}:{attempt}:{rank}"

    def mark_started(self, key: str) -> None:
        self.started.add(key)
        self._save()

    def mark_stopped(self, key: str) -> None:
        self.stopped.add(key)
        self._save()

    def mark_fenced(self, key: str) -> None:
        self.fenced.add(key)
        self._save()

    def mark_exited(self, key: str) -> None:
        self.exited.add(key)
        self._save()

    def unreported(self) -> list[tuple[str, int, int]]:
        """(job id, attempt, rank) of tasks started and never reported ended: a previous run of the agent died
        with them (its tasks die with it)."""
        keys = sorted(self.started - self.exited - self.stopped)
        return [(job_id, int(attempt), int(rank)) for job_id, attempt, rank in (k.rsplit(":", 2) for k in keys)]

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(
                {
                    "started": sorted(self.started),
                    "stopped": sorted(self.stopped),
                    "exited": sorted(self.exited),
                    "fenced": sorted(self.fenced),
                },
                f,
            )
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
