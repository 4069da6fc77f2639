"""Checkpoints are mirrored when a file in the checkpoint directory is complete, not only on the sync timer (a node
killed just after a save then loses nothing of it). Real processes and a real inotify."""

import asyncio
import os

from shared.events import StartTask, TaskExited
from shared.jobs import Algorithm
from shared.storage import StoragePolicy
from services.agent.agent import Agent
from services.agent.checkpoints import ChangeWatch, CheckpointStore
from services.agent.preparation import Preparer
from tests.factories import node, spec, unique

TIMER_S = 600  # far past every bound below: only a mirror on change can pass


async def test_a_completed_file_wakes_the_watch_and_a_partial_one_does_not(tmp_path):
    (tmp_path / "old").mkdir()
    with ChangeWatch(tmp_path) as changes:
        (tmp_path / "model.pt.tmp").write_bytes(b"half")
        assert not await changes.wait(0.5)  # still being written
        os.replace(tmp_path / "model.pt.tmp", tmp_path / "model.pt")
        assert await changes.wait(TIMER_S)
        (tmp_path / "old" / "step.json").write_text("{}")  # in a directory that was there
        assert await changes.wait(TIMER_S)
        (tmp_path / "new").mkdir()  # and in one made since
        assert await changes.wait(TIMER_S)
        (tmp_path / "new" / "optimizer.pt").write_bytes(b"x")
        assert await changes.wait(TIMER_S)


async def test_a_saved_checkpoint_is_mirrored_long_before_the_timer(tmp_path):
    sent: list = []

    async def publish(message) -> None:
        sent.append(message)

    data = tmp_path / "data"
    policy = StoragePolicy(storage_root=f"file://{data}/storage", checkpoint_root=f"file://{data}/checkpoints")
    agent = Agent(
        node=node(node_id="n1"),
        root=data / "agents" / "n1",
        publish=publish,
        preparer=Preparer(data / "engines", {}),
        checkpoints=CheckpointStore(policy.checkpoint_root),
        storage=policy,
        checkpoint_sync_s=TIMER_S,
        shutdown_grace_s=1,
    )
    job = unique("ckpt")
    save = (
        'import os, time; d = os.environ["TRAINMASTER_CHECKPOINT_DIR"]; '
        'open(d + "/model.pt.tmp", "w").write("step 7"); os.replace(d + "/model.pt.tmp", d + "/model.pt"); '
        'print("saved", flush=True); time.sleep(60)'
    )
    await agent.start(
        StartTask(
            event_id=f"{job}:1:0:start",
            node_id="n1",
            job_id=job,
            attempt=1,
            project_id="p",
            user_name="alice",
            algorithm=Algorithm(command=f"python3 -c '{save}'"),
            spec=spec(),
        )
    )
    mirrored = data / "checkpoints" / "p" / job / "model.pt"
    try:
        for _ in range(300):
            if mirrored.exists():
                break
            await asyncio.sleep(0.05)
        assert mirrored.exists() and mirrored.read_text() == "step 7"
        assert not [m for m in sent if isinstance(m, TaskExited)]  # mirrored while it ran, not at its end
    finally:
        await agent.shutdown()


async def test_a_linked_directory_is_not_watched_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "link").symlink_to(elsewhere)
    with ChangeWatch(tmp_path / "ckpt") as changes:
        assert list(changes.watches.values()) == [tmp_path / "ckpt"]
        (elsewhere / "x").write_text("x")
        assert not await changes.wait(0.5)
    with ChangeWatch(tmp_path / "ckpt" / "link") as changes:  # the directory itself swapped for a link
        assert changes.watches == {}


async def test_a_folder_moved_out_and_a_link_left_in_its_place_turns_no_watch_onto_the_host(tmp_path):
    """A watch follows its folder, and its path was kept: moved out and replaced by a link to a host folder, a
    folder made in the moved one was walked and watched through the link (found by review)."""
    top, outside, host = tmp_path / "checkpoint", tmp_path / "elsewhere", tmp_path / "host"
    (top / "a").mkdir(parents=True)
    (host / "inside").mkdir(parents=True)
    outside.mkdir()
    with ChangeWatch(top) as changes:
        assert {p.name for p in changes.watches.values()} == {"checkpoint", "a"}
        os.rename(top / "a", outside / "a")  # out of the checkpoint folder, still watched by the kernel
        assert await changes.wait(5)  # a folder gone: a change (what was in it is no longer the checkpoint's)
        (top / "a").symlink_to(host)  # the same path, now a link to a folder of the host
        (outside / "a" / "inside").mkdir()  # an event on the moved folder's watch
        await asyncio.sleep(0.2)
        changes._read()
        assert all(host not in p.parents and p != host for p in map(lambda p: p.resolve(), changes.watches.values()))
        assert {p.name for p in changes.watches.values()} == {"checkpoint"}


def test_a_large_file_mostly_of_holes_is_not_uploaded(tmp_path):
    """The quota counts what is on disk, an upload the whole file: a task truncating files up to the per-file limit
    sent the storage everything while it wrote almost nothing (found by review)."""
    from services.agent.checkpoints import Mirror

    local, remote = tmp_path / "checkpoint", tmp_path / "storage"
    local.mkdir()
    remote.mkdir()
    with open(local / "huge.bin", "wb") as f:
        f.truncate(256 * 2**20)  # 256 MiB of holes
    (local / "model.pt").write_bytes(os.urandom(4096))
    kept = Mirror(f"file://{remote}").sync(local, {})
    assert sorted(p.name for p in remote.iterdir()) == ["model.pt"] and list(kept) == ["model.pt"]


def test_an_output_folder_reached_through_a_link_the_task_made_is_not_walked(tmp_path):
    """`outputs -> /`: the output folder `outputs/<name>` then named the host's `/<name>`, which the root agent
    walked at every upload (its files were refused, the walk was not; found by review)."""
    from services.agent.checkpoints import Mirror

    work, host, remote = tmp_path / "work", tmp_path / "host", tmp_path / "storage"
    (host / "logs").mkdir(parents=True)
    (host / "logs" / "secret.txt").write_text("the host's")
    work.mkdir()
    remote.mkdir()
    (work / "outputs").symlink_to(host)
    assert Mirror(f"file://{remote}").sync(work / "outputs" / "logs", {}, anchor=work) == {}
    assert list(remote.iterdir()) == []
