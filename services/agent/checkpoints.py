"""Directories mirrored through fsspec: checkpoints while a task runs (restored on any node), inputs, outputs."""
import logging
import os
import stat
from pathlib import Path

import fsspec

from shared.storage import check_segment

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

    def sync(self, local: Path, uploaded: Manifest, *, delete: bool = True, anchor: Path | None = None) -> Manifest:
        """Upload what changed since the last sync (and drop what was deleted); return the new manifest.

        `local` belongs to the task, which may swap files and directories for links while this runs: every file
        is opened from `anchor` (a directory the task cannot replace; default `local`) one component at a time
        without following links, and read through that handle."""
        anchor = anchor or local
        inside = local.relative_to(anchor).as_posix() if local != anchor else ""
        current = _scan(local)
        for relative, stamp in current.items():
            if uploaded.get(relative) != stamp:
                try:
                    fd = open_confined(anchor, f"{inside}/{relative}" if inside else relative)
                except OSError:  # replaced by a link or gone since the scan: not uploaded
                    continue
                try:
                    remote = self._remote(relative)
                    self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                    tmp = f"{remote}.uploading"
                    self.fs.put_file(f"/proc/self/fd/{fd}", tmp)
                    self.fs.mv(tmp, remote)
                finally:
                    os.close(fd)
        for relative in set(uploaded) - set(current) if delete else ():
            try:
                self.fs.rm(self._remote(relative))
            except FileNotFoundError:
                pass
        return current


class CheckpointStore:
    """Every job's checkpoint directory under one storage URL, by project: <url>/<project>/<job>."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def location(self, project_id: str, job_id: str) -> str:
        return f"{self.url}/{check_segment(project_id)}/{check_segment(job_id)}"

    def restore(self, project_id: str, job_id: str, local: Path) -> Manifest:
        return Mirror(self.location(project_id, job_id)).restore(local)

    def sync(self, project_id: str, job_id: str, local: Path, uploaded: Manifest,
             anchor: Path | None = None) -> Manifest:
        return Mirror(self.location(project_id, job_id)).sync(local, uploaded, anchor=anchor)


def open_confined(top: Path, relative: str) -> int:
    """A read handle on the regular file `top/relative`, following no link on the way (top included)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        *dirs, name = relative.split("/")
        for part in dirs:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file).st_mode):
        os.close(file)
        raise OSError(f"{relative} is not a regular file")
    return file


def _scan(local: Path) -> Manifest:
    manifest: Manifest = {}
    for root, _, files in os.walk(local):
        for name in files:
            path = Path(root) / name
            if name.endswith((".tmp", ".partial")):  # being written by the task: next time
                continue
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):  # links and devices are not the task's data
                manifest[str(path.relative_to(local))] = (info.st_size, info.st_mtime_ns)
    return manifest
