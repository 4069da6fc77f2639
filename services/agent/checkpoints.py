"""Directories mirrored through fsspec: checkpoints while a task runs (restored on any node), inputs, outputs."""

import asyncio
import ctypes
import errno
import logging
import os
import re
import stat
import struct
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import fsspec
from fsspec.callbacks import Callback
from fsspec.implementations.local import LocalFileSystem

from shared.egress import is_http
from shared.storage import check_segment
from services.agent.sizecap import Tally, TooLarge
from services.agent.transfers import counted, moved

log = logging.getLogger(__name__)

Manifest = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns) last uploaded
PARTIAL = (".tmp", ".partial")  # being written by the task: mirrored once renamed
UPLOADING = ".tm-uploading"  # a file being written to storage by a copy (`writing_name`): never restored
# the whole shape `writing_name` gives (a task's own file that merely ends so is restored like any other)
WRITING = re.compile(r"\.[0-9a-f]{32}" + re.escape(UPLOADING) + "$")
CHUNK = 1 << 20
# a copy's file this long unwritten is a leftover (`Mirror._tidy`): an object store may date a multipart upload from
# its start, and a checkpoint of a terabyte takes hours to send
LEFTOVER_S = 86400.0


Check = Callable[[str], object]  # raises where a resolved local path is not storage the job may use


class Mirror:
    """A local directory kept in step with a remote one: `file:///shared/x`, `s3://bucket/prefix` (MinIO, S3).

    The agent mirrors as root, and a `file://` tree may be one that tasks or other users of the host can write to
    (a shared folder the operator allows): there, links are never followed below the URL's own path (each file is
    opened, made, renamed and removed one component at a time, from a handle on the folder above it), and the URL's
    path, resolved at each use, must still pass `check` (a link planted at or above it after the job was admitted
    would otherwise move it). A name a listing gives that would land outside the local folder (an object store key
    `a/../../x` or `a//x`) is refused."""

    def __init__(self, url: str, *, check: Check | None = None) -> None:
        if is_http(url):  # fsspec would connect wherever DNS says, and follow redirects
            raise ValueError(
                "http(s) URLs are fetched through the egress policy (services.agent.downloads), never mirrored"
            )
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self.local = isinstance(self.fs, LocalFileSystem)
        self.check = check

    def _remote(self, relative: str = "") -> str:
        return f"{self.root.rstrip('/')}/{relative}".rstrip("/")

    def _local_root(self) -> str:
        """The URL's path resolved now, checked again (`check`): what is below it is walked following no link."""
        resolved = os.path.realpath(self._remote())
        if self.check is not None:
            self.check(resolved)
        return resolved

    def restore(self, local: Path, tally: Tally | None = None, *, tidy_after_s: float | None = None) -> Manifest:
        """Copy the remote contents into `local`, within the tally's caps (all of it counts as one download);
        what is there now counts as uploaded. With `tidy_after_s`, what copies cut short left there (`WRITING`
        names: an agent that died mid-write) and nothing wrote for that long is then removed (`_tidy`)."""
        local.mkdir(parents=True, exist_ok=True)
        tally = tally or Tally()
        if self.local:
            self._restore_local(local, tally, tidy_after_s=tidy_after_s)
            return _scan(local)
        remote = self._remote()
        if not self.fs.exists(remote):
            return {}
        stale: list[str] = []
        if self.fs.isfile(remote):
            listed = {remote: self.fs.info(remote)}
            files = {remote: local / inside_name(remote.rsplit("/", 1)[-1], remote)}
        else:
            found = self.fs.find(remote, detail=True)
            listed = {p: i for p, i in found.items() if not WRITING.search(p)}
            files = {path: local / inside_name(path[len(remote) + 1 :], path) for path in listed}
            now = time.time()
            stale = [
                p
                for p, i in found.items()
                if WRITING.search(p) and _older(_written_at(i), now=now, limit_s=tidy_after_s)
            ]
        size = 0
        tally.expect(sum(listed_size(info) for info in listed.values()))  # a listing refuses early, the copy counts
        for path, target in files.items():
            moved()  # a restore given up makes nothing more
            target.parent.mkdir(parents=True, exist_ok=True)
            with self.fs.open(path, "rb") as source:
                size = _copy(source, target, tally, size)
        self._tidy(stale, lambda: self.fs.rm(stale))
        return _scan(local)

    def _tidy(self, stale: list[str], remove: Callable[[], object]) -> None:
        """Remove the leftovers a restore found (tidying only: a failure is said, the restore stands). A copy
        under way writes its local file as it goes, and an object store's is renamed once whole: one unwritten
        for `LEFTOVER_S` is nobody's. Never a file of the job's own (only the whole shape `writing_name` gives)."""
        if not stale:
            return
        moved()  # a restore given up removes nothing; a removal that hangs is the restore's stall
        try:
            remove()
        except Exception as exc:  # noqa: BLE001 - not there any more, or the storage away: left for the next one
            log.warning("%s: what copies cut short left was not all removed: %r", self.url, exc)
        else:
            log.info("%s: removed %d files copies cut short left", self.url, len(stale))

    def _restore_local(self, local: Path, tally: Tally, *, tidy_after_s: float | None = None) -> None:
        """`restore` from a local folder: its regular files, each opened from `/` one component at a time following
        no link (a folder swapped for a link since the check, anywhere on the way, is an OSError, nothing read); a
        link in it is copied as the file it leads to when that file is inside the folder or passes `check` (a
        Hugging Face cache's snapshot is links into its blobs), and left out otherwise."""
        root = self._local_root()
        stale: list[str] = []  # relative names of leftovers (`_tidy`)
        try:
            top = os.stat(root)
        except FileNotFoundError:
            return
        if stat.S_ISREG(top.st_mode):  # the URL names one file: saved under the URL's own name, not its target's
            listed = {inside_name(os.path.basename(self._remote()), self.url): (top.st_size, root)}
        else:
            listed, stale = self._listing(root, tidy_after_s=tidy_after_s)
        tally.expect(sum(size for size, _ in listed.values()))
        size = 0
        for relative, (_, source) in listed.items():
            moved()  # a restore given up makes nothing more
            target = local / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(open_confined(Path("/"), source.lstrip("/")), "rb") as opened:
                size = _copy(opened, target, tally, size)
        self._tidy(stale, lambda: _remove_each(root, stale))

    def _listing(self, root: str, *, tidy_after_s: float | None = None) -> tuple[dict[str, tuple[int, str]], list[str]]:
        """What a restore of the folder `root` copies: relative name -> (size, the resolved path to open); and
        with `tidy_after_s`, the leftovers of copies cut short that nothing wrote for that long (`_tidy`)."""
        now, stale = time.time(), []
        listed: dict[str, tuple[int, str]] = {}
        left_out = []
        for folder, folders, files in os.walk(root):  # a link to a folder is not walked into: said, left out
            links = [os.path.join(folder, d) for d in folders if os.path.islink(os.path.join(folder, d))]
            left_out += [os.path.relpath(link, root) for link in links]
            for name in files:
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root)
                try:
                    info = os.lstat(path)
                    if stat.S_ISLNK(info.st_mode):
                        path = os.path.realpath(path)
                        info = os.stat(path)
                        if not stat.S_ISREG(info.st_mode) or not self._may_read(root, path):
                            left_out.append(relative)
                            continue
                except OSError:  # gone since the walk, or a link to nothing or to itself
                    left_out.append(relative)
                    continue
                if stat.S_ISREG(info.st_mode) and not WRITING.search(name):  # not a copy's cut short
                    listed[relative] = (info.st_size, path)
                elif (
                    stat.S_ISREG(info.st_mode)
                    and path == os.path.join(folder, name)  # the copy's file itself, not a link's target
                    and _older(info.st_mtime, now=now, limit_s=tidy_after_s)
                ):
                    stale.append(relative)  # WRITING names it (not listed above)
        if left_out:
            log.warning("%s: links left out, leading outside what the job may read: %s", self.url, left_out[:5])
        return listed, stale

    def _may_read(self, root: str, path: str) -> bool:
        """Whether a link's resolved target may be copied: inside the folder restored, or storage the job may use."""
        if path.startswith(root.rstrip("/") + "/"):
            return True
        if self.check is None:
            return False
        try:
            self.check(path)
        except ValueError:
            return False
        return True

    def sync(self, local: Path, uploaded: Manifest, *, delete: bool = True, anchor: Path | None = None) -> Manifest:
        """Upload what changed since the last sync (and drop what was deleted); return the new manifest.

        `local` belongs to the task, which may swap files and directories for links while this runs: every file
        is opened from `anchor` (a directory the task cannot replace; default `local`) one component at a time
        without following links, and read through that handle."""
        anchor = anchor or local
        inside = local.relative_to(anchor).as_posix() if local != anchor else ""
        if inside and not _reached(anchor, inside):  # a link on the way (`outputs -> /`): not the task's folder
            return uploaded
        current = _scan(local, most=MAX_MIRRORED_FILES)
        refused: dict[str, OSError] = {}
        root = None
        if self.local:
            root = self._local_root()
            os.close(_folder(root, [], make=True))  # the URL's own path, checked as resolved, made following no link
        for relative, stamp in current.items():
            if uploaded.get(relative) != stamp:
                try:
                    fd = open_confined(anchor, f"{inside}/{relative}" if inside else relative)
                except OSError:  # replaced by a link or gone since the scan: not uploaded
                    continue
                try:
                    if mostly_holes(os.fstat(fd)):
                        refused[relative] = OSError(errno.EFBIG, "mostly holes (a sparse file): not uploaded")
                        continue
                    if root is not None:
                        try:
                            put_confined(root, relative, fd)
                        except OSError as exc:  # a link (or a file) where a folder of it should be: not uploaded
                            refused[relative] = exc
                        continue
                    remote = self._remote(relative)
                    self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
                    tmp = writing_name(remote)
                    moved()  # a copy given up while it reached the storage sends nothing
                    try:
                        self.fs.put_file(f"/proc/self/fd/{fd}", tmp, callback=Moving())
                        moved()  # a copy given up renames nothing
                        self.fs.mv(tmp, remote)
                    except BaseException:  # its own object being written, cut short: removed if it can be
                        try:
                            self.fs.rm(tmp)
                        except Exception:  # noqa: BLE001 - not there, or the storage still away: left
                            pass
                        raise
                finally:
                    os.close(fd)
                moved()
        for relative in set(uploaded) - set(current) if delete else ():
            moved()  # a copy given up removes nothing
            try:
                if root is not None:
                    remove_confined(root, relative)
                else:
                    self.fs.rm(self._remote(relative))
            except FileNotFoundError:
                pass
            except OSError as exc:  # a link on its way: nothing removed through it
                refused[relative] = exc
        if refused:
            log.warning(
                "%s: %d files not mirrored, a link or a file where a folder should be: %s",
                self.url,
                len(refused),
                "; ".join(f"{name}: {exc.strerror or exc}" for name, exc in sorted(refused.items())[:5]),
            )
        kept = {name: stamp for name, stamp in current.items() if name not in refused}
        # a deletion refused stays in the manifest, as uploaded: the next sync tries it again
        return kept | {name: uploaded[name] for name in refused if name not in current and name in uploaded}


class CheckpointStore:
    """Every job's checkpoint directory under one storage URL, by project: <url>/<project>/<job>."""

    def __init__(self, url: str, *, max_bytes: int | None = None) -> None:
        self.url = url.rstrip("/")
        self.max_bytes = max_bytes  # what a restored checkpoint may be (None: no cap)

    def location(self, project_id: str, job_id: str) -> str:
        return f"{self.url}/{check_segment(project_id)}/{check_segment(job_id)}"

    def restore(self, project_id: str, job_id: str, local: Path) -> Manifest:
        """The job's checkpoint copied into `local` for its next attempt; then what copies of its earlier attempts
        cut short left there, a day unwritten, removed (`Mirror._tidy`: never restored, they stayed in storage for
        good)."""
        try:
            return Mirror(self.location(project_id, job_id)).restore(
                local, Tally(per_download=self.max_bytes), tidy_after_s=LEFTOVER_S
            )
        except TooLarge as exc:
            raise TooLarge(f"checkpoint {self.location(project_id, job_id)}: {exc}") from None

    def sync(
        self, project_id: str, job_id: str, local: Path, uploaded: Manifest, anchor: Path | None = None
    ) -> Manifest:
        return Mirror(self.location(project_id, job_id)).sync(local, uploaded, anchor=anchor)


SPARSE_FROM = 64 * 2**20  # a file at least this large ...
SPARSE_SHARE = 8  # ... with less than an eighth of it on disk is not uploaded


def mostly_holes(info: os.stat_result) -> bool:
    """A large file of which the disk holds under an eighth: the quota counts what is on disk, an upload all of it,
    so a task truncating files up to the per-file limit wrote a little and sent the storage everything, again at
    each touch (found by review). A checkpoint is dense; a compressing filesystem keeps well over an eighth of
    one."""
    return info.st_size >= SPARSE_FROM and info.st_blocks * 512 * SPARSE_SHARE < info.st_size


def open_confined(top: Path, relative: str) -> int:
    """A read handle on the regular file `top/relative`, following no link on the way (top included)."""
    fd = os.open(top, DIRECTORY)
    try:
        *dirs, name = relative.split("/")
        for part in dirs:
            inner = os.open(part, DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file).st_mode):
        os.close(file)
        raise OSError(f"{relative} is not a regular file")
    return file


def inside_name(relative: str, listed: str) -> str:
    """`relative` (a name a remote listing gave, under the folder restored) when it stays inside the local folder;
    ValueError naming the listed path otherwise (an object store key holding `..`, `.` or an empty segment)."""
    parts = relative.split("/")
    if not relative or "\0" in relative or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{listed!r} would be written outside the folder it is restored into")
    return relative


class Moving(Callback):
    """fsspec's progress callback of an upload: each update (a chunk sent, a size or a position set) says the copy
    moves (`transfers.moved`), from whichever thread fsspec sends it on (an async file system's, s3fs's, is one of
    fsspec's own): the progress is the one of the copy that made the callback."""

    def __init__(self) -> None:
        super().__init__()
        self.progress = counted()

    def call(self, hook_name: str | None = None, **kwargs: object) -> None:
        for progress in self.progress:
            progress.moved()


def _copy(source: BinaryIO, target: Path, tally: Tally, size: int) -> int:
    """Copy one file, counting its bytes as part of a download `size` long so far; a file cut short at a cap is
    removed."""
    moved()  # a restore given up (while its source was opened) makes nothing
    try:
        with open(target, "wb") as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                tally.count(size, len(chunk))
                out.write(chunk)
                moved()
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return size


# A folder on the way, opened only to look up the next name in it: search permission is enough, as for a path
# (O_PATH: a non-root agent, or root on NFS with root_squash, may cross a folder it may not list).
DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW


def _folder(root: str, parts: list[str], *, make: bool) -> int:
    """A handle on `root/parts...` (`root` absolute, resolved), each component from `/` opened (made first, with
    `make`, where missing) following no link: a link planted anywhere on the way, below `root` or in it since it
    was resolved and checked, is an OSError, never a way elsewhere."""
    fd = os.open("/", DIRECTORY)
    try:
        for part in [*(p for p in root.split("/") if p), *parts]:
            try:
                inner = os.open(part, DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:  # made meanwhile: opened below, as a folder or not at all
                    pass
                inner = os.open(part, DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def writing_name(name: str) -> str:
    """The name a file is written under beside `name` before it is renamed over it: one of this writer's own (a copy
    given up that wakes later must not write into, nor rename, another attempt's file being written)."""
    return f"{name}.{uuid.uuid4().hex}{UPLOADING}"


def put_confined(root: str, relative: str, source: int) -> None:
    """Write what `source` reads to `root/relative`: a new file beside it, then renamed over it (a link there is
    replaced, never written through), every folder on the way opened following no link."""
    *dirs, name = inside_name(relative, relative).split("/")
    folder = _folder(root, dirs, make=True)
    tmp = writing_name(name)
    try:
        moved()  # a copy given up while it reached the folder makes nothing in it
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
        try:
            os.lseek(source, 0, os.SEEK_SET)
            while chunk := os.read(source, CHUNK):
                view = memoryview(chunk)
                while view:  # a write may take less than it is given
                    view = view[os.write(out, view) :]
                moved()
        finally:
            os.close(out)
        moved()  # a copy given up renames nothing
        os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:  # its own file being written, cut short: gone
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        raise
    finally:
        os.close(folder)


def remove_confined(root: str, relative: str) -> None:
    """Remove `root/relative` (a link there is removed itself), every folder on the way opened following no link."""
    *dirs, name = inside_name(relative, relative).split("/")
    folder = _folder(root, dirs, make=False)
    try:
        os.unlink(name, dir_fd=folder)
    finally:
        os.close(folder)


def _older(written: float | None, *, now: float, limit_s: float | None) -> bool:
    """Whether a file last written at `written` (a Unix time; None: not known, never) is older than `limit_s`
    (None: no file is)."""
    return written is not None and limit_s is not None and now - written > limit_s


def _remove_each(root: str, relatives: list[str]) -> None:
    """Each of `relatives` removed from `root` (following no link); one gone meanwhile passed over."""
    for relative in relatives:
        try:
            remove_confined(root, relative)
        except FileNotFoundError:
            pass


def _written_at(info: dict) -> float | None:
    """When an object store says a file was last written (s3fs: `LastModified`; others: `mtime` or `created`), as
    a Unix time; None where it says nothing that makes sense (such a file is left)."""
    for key in ("LastModified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime):  # one without a zone is taken as UTC (an object store's clock)
            return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def listed_size(info: dict) -> int:
    """The size a listing gives a file (a claim of the storage: 0 when it gives none that makes sense)."""
    size = info.get("size")
    return size if isinstance(size, int) and size > 0 else 0


def _reached(anchor: Path, inside: str) -> bool:
    """Whether `anchor/inside` is a folder reached from `anchor` following no link: the task's `outputs` made a link
    to `/` had the root agent walk the host's `/<name>` at every upload (found by review)."""
    try:
        fd = os.open(anchor, DIRECTORY)
    except OSError:
        return False
    try:
        for part in inside.split("/"):
            inner = os.open(part, DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


MAX_MIRRORED_FILES = 100_000  # files a checkpoint or output folder may hold to be mirrored


class TooManyFiles(ValueError):
    """A task's folder holds more files than a mirror keeps track of: nothing of it is mirrored."""


def _scan(local: Path, *, partial: bool = False, most: int | None = None) -> Manifest:
    """The regular files under `local` (no link followed or listed), those named as being written (`PARTIAL`) only
    with `partial`; `TooManyFiles` past `most` (a task's folder of millions of empty files was a manifest of
    hundreds of MB in the agent, walked again at every sync)."""
    manifest: Manifest = {}
    if os.path.islink(local):  # os.walk follows a link at its top: the task's link to `/` had the agent walk the host
        return manifest
    entries = 0  # folders count too: millions of empty ones were walked at every sync
    for root, folders, files in os.walk(local):
        entries += len(folders) + len(files)
        if most is not None and entries > 2 * most:
            raise TooManyFiles(f"{local.name} holds more than {2 * most:,} files and folders")
        for name in files:
            path = Path(root) / name
            if name.endswith(PARTIAL) and not partial:  # being written by the task: next time
                continue
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):  # links and devices are not the task's data
                manifest[str(path.relative_to(local))] = (info.st_size, info.st_mtime_ns)
                if most is not None and len(manifest) > most:
                    raise TooManyFiles(f"{local.name} holds more than {most:,} files")
    return manifest


# inotify (linux/inotify.h): what counts as a change of a checkpoint directory
IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x8, 0x40, 0x80, 0x100, 0x200
IN_Q_OVERFLOW, IN_ISDIR, IN_ONLYDIR, IN_DONT_FOLLOW = 0x4000, 0x40000000, 0x01000000, 0x02000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
WATCH_MASK = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_ONLYDIR | IN_DONT_FOLLOW
EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows
MAX_WATCHES = 256  # directories watched per task (deeper or wider trees rely on the timer)
MIN_GAP_S = 0.25  # a task that writes without pause is mirrored at most this often on change


class ChangeWatch:
    """Says when a file in a directory tree is complete: closed after writing or renamed into place (files named
    *.tmp or *.partial excepted), or removed. Without inotify it never wakes early and the caller's timer does
    the work."""

    def __init__(self, top: Path) -> None:
        self.changed = asyncio.Event()
        self.watches: dict[int, Path] = {}
        self.last = 0.0
        self.loop = asyncio.get_running_loop()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            log.warning("no inotify (%s): %s is mirrored on its timer only", os.strerror(ctypes.get_errno()), top)
            return
        self._watch_tree(top)
        self.loop.add_reader(self.fd, self._read)

    def __enter__(self) -> "ChangeWatch":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1

    async def wait(self, timeout_s: float) -> bool:
        """True when something changed, False when `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout=timeout_s)
        except TimeoutError:
            return False
        self.changed.clear()
        gap = self.last + MIN_GAP_S - self.loop.time()
        if gap > 0:
            await asyncio.sleep(gap)
        self.last = self.loop.time()
        return True

    def _watch_tree(self, top: Path) -> None:
        """Watch `top` and the directories under it, following no link (the task owns them and may plant some); at
        the cap, nothing is listed (each folder moved in was walked whole on the agent's loop, however large)."""
        if len(self.watches) >= MAX_WATCHES:
            return
        try:
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                return
        except OSError:
            return
        for root, dirs, _ in os.walk(top, followlinks=False):
            if not self._watch(Path(root)):
                dirs.clear()

    def _watch(self, path: Path) -> bool:
        if len(self.watches) >= MAX_WATCHES:
            return False
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), WATCH_MASK)
        if wd < 0:  # gone, or replaced by a link (not followed): nothing to watch
            return False
        self.watches[wd] = path
        return True

    def _forget(self, gone: Path) -> None:
        """The watches of a folder moved away or removed, and of those under it: a watch follows its folder, and its
        path, kept, would name whatever the task put there next (a link to a host folder the agent then walked and
        watched; found by review)."""
        for wd, path in list(self.watches.items()):
            if path == gone or gone in path.parents:
                del self.watches[wd]
                self.libc.inotify_rm_watch(self.fd, wd)

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        offset = 0
        while offset + EVENT.size <= len(data):
            wd, mask, _, length = EVENT.unpack_from(data, offset)
            name = data[offset + EVENT.size : offset + EVENT.size + length].rstrip(b"\0").decode(errors="replace")
            offset += EVENT.size + length
            if mask & IN_Q_OVERFLOW:
                self.changed.set()
            elif mask & IN_ISDIR:
                if mask & (IN_CREATE | IN_MOVED_TO) and wd in self.watches:
                    self._watch_tree(self.watches[wd] / name)
                    self.changed.set()  # files may have been written into it before it was watched
                elif mask & (IN_MOVED_FROM | IN_DELETE) and wd in self.watches:
                    self._forget(self.watches[wd] / name)
                    self.changed.set()
            elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE) and not name.endswith(PARTIAL):
                self.changed.set()  # (a file just created is not complete yet: its close says when it is)
