"""What this agent has ever started or been told to skip, kept on disk so a restarted agent never reruns it."""
import json
import os
from pathlib import Path


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.started: set[str] = set()
        self.stopped: set[str] = set()
        if path.exists():
            data = json.loads(path.read_text())
            self.started, self.stopped = set(data["started"]), set(data["stopped"])

    @staticmethod
    def key(job_id: str, attempt: int, rank: int) -> str:
        return f"{job_id}:{attempt}:{rank}"

    def mark_started(self, key: str) -> None:
        self.started.add(key)
        self._save()

    def mark_stopped(self, key: str) -> None:
        self.stopped.add(key)
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump({"started": sorted(self.started), "stopped": sorted(self.stopped)}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
