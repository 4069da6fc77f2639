"""Checkpoint storage through fsspec: a task's checkpoint directory mirrored while it runs, restored on any node."""
import logging
import os
from pathlib import Path

import fsspec

log = logging.getLogger(__name__)

Manifest = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) last uploaded


class CheckpointStore:
    """`file:///shared/ckpt` (a directory every node sees) or `s3://bucket/prefix` (MinIO, S3) and the like."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)

    def _remote(self, job_id: str, relative: str = "") -> str:
        return f"{self.root.rstrip('/')}/{job_id}/{relative}".rstrip("/")

    def restore(self, job_id: str, local: Path) -> Manifest:
        """Copy the job's last synced checkpoint into `local`; what is there now counts as uploaded."""
        local.mkdir(parents=True, exist_ok=True)
        remote = self._remote(job_id)
        if not self.fs.exists(remote):
            return {}
        for path in self.fs.find(remote):
            relative = path[len(remote) + 1:]
            target = local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))
        return _scan(local)

    def sync(self, job_id: str, local: Path, uploaded: Manifest) -> Manifest:
        """Upload what changed since the last sync and drop what the task deleted; return the new manifest."""
        current = _scan(local)
        for relative, stamp in current.items():
            if uploaded.get(relative) != stamp:
                remote = self._remote(job_id, relative)
                self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                tmp = f"{remote}.uploading"
                self.fs.put_file(str(local / relative), tmp)
                self.fs.mv(tmp, remote)
        for relative in set(uploaded) - set(current):
            try:
                self.fs.rm(self._remote(job_id, relative))
            except FileNotFoundError:
                pass
        return current


def _scan(local: Path) -> Manifest:
    manifest: Manifest = {}
    for root, _, files in os.walk(local):
        for name in files:
            path = Path(root) / name
            if name.endswith((".tmp", ".partial")):  # being written by the task: next time
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            manifest[str(path.relative_to(local))] = (stat.st_size, stat.st_mtime_ns)
    return manifest
