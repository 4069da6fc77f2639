"""The agent mirrors inputs, code and outputs as root, and a `file://` tree the operator allows may be one that tasks
or other users of the host can write to: a link planted there is never followed (reading a root-only file into a
task's inputs, writing an output into a system folder), a name an object store lists cannot land outside the local
folder, and a job's URL is checked again as resolved when it is used."""

import os

import fsspec
import pytest

from shared.storage import StorageError, StoragePolicy, local_check
from services.agent.checkpoints import Mirror


@pytest.fixture
def tree(tmp_path):
    """A shared folder anyone may write to, a secret beside it, and a system folder."""
    shared, secret, system = tmp_path / "shared", tmp_path / "secret", tmp_path / "system"
    for folder in (shared, secret, system):
        folder.mkdir()
    (secret / "key").write_text("root only")
    return shared, secret, system


def test_a_restore_copies_the_regular_files_and_follows_no_link(tree, tmp_path):
    shared, secret, _ = tree
    data = shared / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "train.csv").write_text("1,2\n")
    (data / "epoch.tmp").write_text("a dataset's own file, named as if partial")
    os.symlink(secret / "key", data / "key")  # planted: a root-only file
    os.symlink(secret, data / "everything")  # planted: a folder of them
    Mirror(f"file://{data}").restore(tmp_path / "inputs")
    copied = sorted(str(p.relative_to(tmp_path / "inputs")) for p in (tmp_path / "inputs").rglob("*") if p.is_file())
    assert copied == ["epoch.tmp", "sub/train.csv"]
    assert (tmp_path / "inputs" / "sub" / "train.csv").read_text() == "1,2\n"
    assert not (tmp_path / "inputs" / "key").exists() and not (tmp_path / "inputs" / "everything").exists()


def test_a_restore_of_one_named_file_reads_it(tree, tmp_path):
    shared, _, _ = tree
    (shared / "weights.bin").write_bytes(b"\1\2")
    assert Mirror(f"file://{shared / 'weights.bin'}").restore(tmp_path / "in") == {
        "weights.bin": (2, (tmp_path / "in" / "weights.bin").stat().st_mtime_ns)
    }


def test_an_upload_writes_through_no_link_planted_in_the_shared_folder(tree, tmp_path):
    shared, _, system = tree
    out = shared / "out"
    out.mkdir()
    os.symlink(system, out / "sub")  # planted: a folder on the upload's way
    os.symlink(system / "crontab", out / "model.pt")  # planted: the name itself
    (system / "victim").write_text("untouched")
    os.link(system / "victim", out / "log.txt.uploading")  # planted: a hard link at the upload's temporary name
    local = tmp_path / "outputs"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "evil").write_text("payload")
    (local / "model.pt").write_text("weights")
    (local / "log.txt").write_text("log")
    uploaded = Mirror(f"file://{out}").sync(local, {})
    assert sorted(uploaded) == ["log.txt", "model.pt"]  # `sub/evil` not: tried again at the next sync
    assert sorted(os.listdir(system)) == ["victim"] and (system / "victim").read_text() == "untouched"
    assert (out / "model.pt").read_text() == "weights" and not (out / "model.pt").is_symlink()
    assert (out / "log.txt").read_text() == "log"
    assert (out / "sub").is_symlink()  # left as found: the file under it was not written


def test_a_deletion_removes_no_file_through_a_link(tree, tmp_path):
    shared, secret, _ = tree
    out = shared / "ckpt"
    out.mkdir()
    os.symlink(secret, out / "old")  # planted where a file the task deleted was uploaded
    local = tmp_path / "ckpt"
    local.mkdir()
    Mirror(f"file://{out}").sync(local, {"old/key": (9, 1)})
    assert (secret / "key").read_text() == "root only"


def test_a_listed_name_that_leaves_the_folder_is_refused(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe("/bucket/vision/ok.bin", b"1")
    fs.pipe("/bucket/vision/x/../../../../etc/cron.d/job", b"* * * * * root sh")
    with pytest.raises(ValueError, match="would be written outside the folder it is restored into"):
        Mirror("memory://bucket/vision").restore(tmp_path / "inputs")
    assert not list((tmp_path / "inputs").rglob("job"))
    fs.rm("/bucket/vision", recursive=True)


def test_a_url_moved_by_a_link_after_its_admission_is_checked_again_where_it_now_leads(tree, tmp_path):
    shared, secret, _ = tree
    policy = StoragePolicy(
        allowed_urls=(f"file://{shared}",),
        storage_root=f"file://{tmp_path / 'storage'}",
        checkpoint_root=f"file://{tmp_path / 'checkpoints'}",
    )
    check = local_check(policy, "vision")
    (shared / "data").mkdir()
    Mirror(f"file://{shared / 'data'}", check=check).restore(tmp_path / "a")  # as admitted: inside
    (shared / "data").rmdir()
    os.symlink(secret, shared / "data")  # planted after the admission: the same URL now leads outside
    with pytest.raises(StorageError, match="outside this project's storage"):
        Mirror(f"file://{shared / 'data'}", check=check).restore(tmp_path / "b")
    local = tmp_path / "out"
    local.mkdir()
    (local / "key").write_text("overwritten")
    with pytest.raises(StorageError):
        Mirror(f"file://{shared / 'data'}", check=check).sync(local, {})
    assert (secret / "key").read_text() == "root only"


def test_a_link_to_a_file_the_job_may_read_is_copied_as_that_file(tree, tmp_path):
    """A Hugging Face cache's snapshot is links into its blobs: a link whose file is inside the folder restored, or
    in storage the job may use, is copied as that file; one leading anywhere else is left out."""
    shared, secret, _ = tree
    cache = shared / "hub" / "models--tiny"
    (cache / "blobs").mkdir(parents=True)
    (cache / "blobs" / "abc123").write_text("weights")
    (cache / "snapshots" / "main").mkdir(parents=True)
    os.symlink("../../blobs/abc123", cache / "snapshots" / "main" / "model.bin")
    os.symlink(secret / "key", cache / "snapshots" / "main" / "key")
    inside = tmp_path / "whole"
    Mirror(f"file://{cache}").restore(inside)  # the blobs are inside the folder restored
    assert (inside / "snapshots" / "main" / "model.bin").read_text() == "weights"
    assert not (inside / "snapshots" / "main" / "key").exists()
    policy = StoragePolicy(
        allowed_urls=(f"file://{shared}",),
        storage_root=f"file://{tmp_path / 'storage'}",
        checkpoint_root=f"file://{tmp_path / 'checkpoints'}",
    )
    snapshot = tmp_path / "snapshot"
    Mirror(f"file://{cache / 'snapshots' / 'main'}", check=local_check(policy, "vision")).restore(snapshot)
    assert (snapshot / "model.bin").read_text() == "weights"  # outside the snapshot, inside what the job may use
    assert not (snapshot / "key").exists()


def test_a_file_named_through_a_link_keeps_the_urls_name(tree, tmp_path):
    shared, _, _ = tree
    (shared / "epoch_10.pt").write_bytes(b"\1")
    os.symlink(shared / "epoch_10.pt", shared / "latest.pt")
    Mirror(f"file://{shared / 'latest.pt'}").restore(tmp_path / "in")
    assert os.listdir(tmp_path / "in") == ["latest.pt"]


def test_a_folder_swapped_for_a_link_after_the_check_leads_nowhere(tree, tmp_path):
    """The URL's path is resolved and checked, then walked from `/` following no link: a folder on it that a task
    swaps for a link right after the check makes the copy fail, not read or write elsewhere."""
    shared, secret, system = tree
    (shared / "x" / "sec").mkdir(parents=True)
    (secret / "sec").mkdir()
    (secret / "sec" / "file").write_text("root only")

    def swap_after_check(path: str) -> None:  # the check passes, then the task moves `x` for a link to `secret`
        if (shared / "x").is_dir() and not (shared / "x").is_symlink():
            os.rename(shared / "x", shared / "x.old")
            os.symlink(secret, shared / "x")

    with pytest.raises(OSError):
        Mirror(f"file://{shared / 'x' / 'sec'}", check=swap_after_check).restore(tmp_path / "in")
    assert not (tmp_path / "in" / "file").exists()
    os.unlink(shared / "x")
    os.rename(shared / "x.old", shared / "x")
    local = tmp_path / "out"
    local.mkdir()
    (local / "evil").write_text("payload")
    with pytest.raises(OSError):
        Mirror(f"file://{shared / 'x' / 'sec'}", check=swap_after_check).sync(local, {})
    assert sorted(os.listdir(secret / "sec")) == ["file"]


def test_a_deletion_refused_is_tried_again_at_the_next_sync(tree, tmp_path):
    shared, secret, _ = tree
    out = shared / "ckpt"
    out.mkdir()
    os.symlink(secret, out / "old")
    local = tmp_path / "ckpt"
    local.mkdir()
    manifest = Mirror(f"file://{out}").sync(local, {"old/key": (9, 1)})
    assert manifest == {"old/key": (9, 1)}  # still to delete
    os.unlink(out / "old")  # the link gone: the next sync finds nothing to delete and forgets it
    assert Mirror(f"file://{out}").sync(local, manifest) == {}


def test_a_copy_given_up_writes_and_renames_nothing_and_a_restore_skips_what_a_copy_left(tmp_path):
    """A copy abandoned (its storage stalled) stops before it makes its file or renames it, leaving nothing; a file
    a copy was writing under its own name (`writing_name`) is never restored."""
    from services.agent import transfers
    from services.agent.checkpoints import UPLOADING, writing_name

    local, remote = tmp_path / "ckpt", tmp_path / "store"
    local.mkdir()
    (local / "model.pt").write_bytes(b"w" * 10)
    given_up = transfers.Progress()
    given_up.abandoned = True
    transfers._MOVING.progress = (given_up,)
    try:
        with pytest.raises(transfers.Stalled):
            Mirror(f"file://{remote}").sync(local, {})
    finally:
        transfers._MOVING.progress = ()
    assert not remote.exists() or list(remote.rglob("*")) == []
    assert writing_name("a") != writing_name("a") and writing_name("a").endswith(UPLOADING)
    remote.mkdir(exist_ok=True)
    (remote / "model.pt").write_bytes(b"saved")
    (remote / writing_name("model.pt")).write_bytes(b"cut sho")
    (remote / f"notes{UPLOADING}").write_bytes(b"the task's own")  # merely ending so: the task's file, restored
    back = tmp_path / "back"
    assert sorted(Mirror(f"file://{remote}").restore(back)) == ["model.pt", f"notes{UPLOADING}"]
    assert sorted(os.listdir(back)) == ["model.pt", f"notes{UPLOADING}"]


def test_what_a_copy_cut_short_left_is_removed_at_the_next_restore_once_a_day_old_and_nothing_else(tmp_path):
    """An agent that died mid-write left its copy's file in the job's checkpoint storage: never restored, it stayed
    there for good. The next attempt's restore removes such files once nothing wrote them for a day (a copy under
    way keeps writing its own, or makes it whole and renames it), never a file of the job's, nor through a link."""
    import time

    from services.agent.checkpoints import UPLOADING, CheckpointStore, writing_name

    store = CheckpointStore(f"file://{tmp_path / 'ckpt'}")
    folder = tmp_path / "ckpt" / "vision" / "job-1"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"saved")
    old, fresh = folder / "sub" / writing_name("model.pt"), folder / writing_name("opt.pt")
    own = folder / f"notes{UPLOADING}"  # the task's own file that merely ends so
    for path in (old, fresh, own):
        path.write_bytes(b"cut sho")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / writing_name("x")).write_bytes(b"not the job's")
    (folder / "linked").symlink_to(elsewhere)
    (folder / writing_name("link")).symlink_to(elsewhere / os.listdir(elsewhere)[0])
    days_ago = time.time() - 2 * 86400
    for path in (old, own, elsewhere / os.listdir(elsewhere)[0]):
        os.utime(path, (days_ago, days_ago))
    assert sorted(store.restore("vision", "job-1", tmp_path / "back")) == ["model.pt", f"notes{UPLOADING}"]
    assert not old.exists() and fresh.exists() and own.exists() and len(os.listdir(elsewhere)) == 1
    assert (folder / "linked").is_symlink()
    # an object store's (its listing's time): the same rule
    fs = fsspec.filesystem("memory")
    fs.pipe(f"/b/c/{writing_name('model.pt')}", b"cut sho")
    fs.pipe("/b/c/model.pt", b"saved")
    assert sorted(Mirror("memory://b/c").restore(tmp_path / "m1", tidy_after_s=3600)) == ["model.pt"]
    assert len(fs.find("/b/c")) == 2  # written just now: a copy may still rename it
    Mirror("memory://b/c").restore(tmp_path / "m2", tidy_after_s=0)
    assert fs.find("/b/c") == ["/b/c/model.pt"]
