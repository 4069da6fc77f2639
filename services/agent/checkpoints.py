"""Directories mirrored through fsspec: checkpoints while a task runs (restored on any node), inputs, outputs."""
import logging
import os
from pathlib import Path

import fsspec

log = logging.getLogger(__name__)

Manifest = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) last uploaded


class Mirror:
    """A local directory kept in step with a remote one: `file:///shared/x`, `s3://bucket/prefix` (MinIO, S3)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)

    def _remote(self, relative: str = "") -> str:
        return f"{self.root.rstrip('/')}/{relative}".rstrip("/")

    def restore(self, local: Path) -> Manifest:
        """Copy the remote contents into `local`; what is there now counts as uploaded."""
        local.mkdir(parents=True, exist_ok=True)
        remote = self._remote()
        if not self.fs.exists(remote):
            return {}
        if self.fs.isfile(remote):
            self.fs.get_file(remote, str(local / remote.rsplit("/", 1)[-1]))
            return _scan(local)
        for path in self.fs.find(remote):
            target = local / path[len(remote) + 1:]
            target.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(target))
        return _scan(local)

    def sync(self, local: Path, uploaded: Manifest, *, delete: bool = True) -> Manifest:
        """Upload what changed since the last sync (and drop what was deleted); return the new manifest."""
        current = _scan(local)
        for relative, stamp in current.items():
            if uploaded.get(relative) != stamp:
                remote = self._remote(relative)
                self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                tmp = f"{remote}.uploading"
                self.fs.put_file(str(local / relative), tmp)
                self.fs.mv(tmp, remote)
        for relative in set(uploaded) - set(current) if delete else ():
            try:
                self.fs.rm(self._remote(relative))
            except FileNotFoundError:
                pass
        return current


class CheckpointStore:
    """Every job's checkpoint directory under one storage URL."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def restore(self, job_id: str, local: Path) -> Manifest:
        return Mirror(f"{self.url}/{job_id}").restore(local)

    def sync(self, job_id: str, local: Path, uploaded: Manifest) -> Manifest:
        return Mirror(f"{self.url}/{job_id}").sync(local, uploaded)


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
