"""The agent's shim server (`services/agent/spawner.py`): a task's shim is forked from it, not started as a Python of
its own, and behaves as one started so: its output, its exit status, nothing of the server or of another task open
in it, its death with the server's. Real processes."""

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import psutil
import pytest

from services.agent.runner import start_shim
from services.agent.spawner import ShimProcess, Spawner


def launch_file(tmp_path: Path, command: str, *, mark: str = "") -> Path:
    """A launch file as `runner.spawn` writes it for a task without a user of its own."""
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    launch = {
        "command": command,
        "env": {"PATH": os.defpath, "TASK": "yes", "MARK": mark},
        "cwd": str(tmp_path),
        "user": None,
        "reach": [],
        "cover": {},
        "cgroup_procs": [],
        "cgroup_joined": None,
        "tmpfs_size": None,
        "shm_size": None,
        "file_size": None,
        "links": {},
    }
    path.write_text(json.dumps(launch))
    path.chmod(0o600)
    return path


async def output(stream: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(stream.read(), timeout=30)).decode()


async def test_a_forked_shim_runs_its_task_and_says_how_it_ended(tmp_path):
    spawner = Spawner()
    try:
        shim = await spawner.start(launch_file(tmp_path, "echo out $TASK; echo err >&2; exit 3"), cwd=tmp_path)
        assert isinstance(shim, ShimProcess)
        out, err = await asyncio.gather(output(shim.stdout), output(shim.stderr))
        assert await asyncio.wait_for(shim.wait(), timeout=30) == 3
        assert (out, err) == ("out yes\n", "err\n")
        assert not list(tmp_path.glob("*.json")), "the shim reads and removes its launch file"
        killed = await spawner.start(launch_file(tmp_path, "kill -TERM $$"), cwd=tmp_path)
        assert await asyncio.wait_for(killed.wait(), timeout=30) == -signal.SIGTERM
    finally:
        spawner.stop()


async def test_the_shim_is_the_servers_child_in_a_session_of_its_own_holding_nothing_of_it(tmp_path):
    """Forked, not started: its parent is the server, not the agent; like a shim started with a new session, it
    leads its own process group; and the task holds only its standard streams, never the server's socket nor
    another task's pipes (an open descriptor of another task's output would let it write into that task's log)."""
    spawner = Spawner()
    try:
        other = await spawner.start(launch_file(tmp_path, "sleep 30"), cwd=tmp_path)
        shim = await spawner.start(launch_file(tmp_path, "ls /proc/$$/fd; echo END; sleep 30"), cwd=tmp_path)
        fds = set()
        while (line := (await asyncio.wait_for(shim.stdout.readline(), timeout=30)).decode().strip()) != "END":
            assert line, "the task ended before it listed its descriptors"
            fds.add(int(line))
        assert fds == {0, 1, 2}, f"the task's shell holds more than its standard streams: {sorted(fds)}"
        process = psutil.Process(shim.pid)
        assert process.ppid() == spawner.server_pid != os.getpid()
        assert os.getpgid(shim.pid) == shim.pid and os.getsid(shim.pid) == shim.pid
        assert other.pid != shim.pid and other.returncode is None
    finally:
        spawner.stop()


async def test_a_task_dies_with_the_server_and_the_next_launch_starts_a_new_one(tmp_path):
    """No task outlives the server that forked its shim (as none outlives the agent): each of its tasks reads as
    killed, its processes are gone, and the next launch is forked by a new server."""
    spawner = Spawner()
    try:
        shim = await spawner.start(launch_file(tmp_path, "echo $$; sleep 60"), cwd=tmp_path)
        shell = int(await asyncio.wait_for(shim.stdout.readline(), timeout=30))
        first = spawner.server_pid
        os.kill(first, signal.SIGKILL)
        assert await asyncio.wait_for(shim.wait(), timeout=30) == -signal.SIGKILL
        for _ in range(100):
            if not psutil.pid_exists(shell) or psutil.Process(shell).status() == psutil.STATUS_ZOMBIE:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the task's shell outlived the server that forked its shim")
        again = await spawner.start(launch_file(tmp_path, "echo again"), cwd=tmp_path)
        assert await output(again.stdout) == "again\n" and await again.wait() == 0
        assert spawner.server_pid not in (None, first)
    finally:
        spawner.stop()


async def test_the_agents_launch_falls_back_to_a_shim_of_its_own_where_the_server_dies_at_once(tmp_path, monkeypatch):
    broken = Spawner()
    monkeypatch.setattr("services.agent.spawner.SHIM", tmp_path / "no-such-shim.py")  # its Python exits at once
    monkeypatch.setattr("services.agent.runner.spawner", lambda: broken)
    try:
        shim = await start_shim(launch_file(tmp_path, "echo alone"), cwd=tmp_path)
        assert not isinstance(shim, ShimProcess)
        assert shim.stdout is not None and await output(shim.stdout) == "alone\n"
        assert await shim.wait() == 0
    finally:
        broken.stop()


def marked(mark: str) -> list[int]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("MARK") == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except psutil.Error:
            pass
    return found


async def test_a_launch_cancelled_once_asked_leaves_nothing_running(tmp_path):
    """The agent cancels a launch when a stop comes while it starts: the shim the server forks for it meanwhile is
    killed with whatever it started, and its end is not taken for another shim's (pids are reused)."""
    spawner = Spawner()
    mark = uuid.uuid4().hex
    try:
        launching = asyncio.create_task(spawner.start(launch_file(tmp_path, "sleep 30", mark=mark), cwd=tmp_path))
        await asyncio.sleep(0)  # the request is sent; its answer has not been read
        launching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await launching
        for _ in range(600):  # its answer comes once the server, started just now, forked the shim
            await asyncio.sleep(0.05)
            if not spawner._abandoned and not spawner._unwatched:  # killed, and its end came
                break
        else:
            raise AssertionError("the cancelled launch's shim was never killed, or its end never came")
        await asyncio.sleep(0.5)  # anything of it still alive would be found below
        assert not marked(mark), "the cancelled launch's task runs on"
        assert not spawner._buffer, "its end was kept for a shim to come"
        after = await spawner.start(launch_file(tmp_path, "exit 5"), cwd=tmp_path)
        assert await asyncio.wait_for(after.wait(), timeout=30) == 5
    finally:
        spawner.stop()


async def test_the_server_kills_only_a_shim_it_forked_and_has_not_reaped(tmp_path):
    """A cancelled launch's kill goes through the server: the pid the agent names may have been reaped and reused
    by then, and only the server, its parent, knows. A pid that is not its unreaped child is left alone."""
    spawner = Spawner()
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        ended = await spawner.start(launch_file(tmp_path, "exit 0"), cwd=tmp_path)
        assert await asyncio.wait_for(ended.wait(), timeout=30) == 0  # reaped by the server
        for pid in (stranger.pid, ended.pid):  # a process the server never forked; a shim it reaped
            spawner._kill(pid)
        running = await spawner.start(launch_file(tmp_path, "echo up; sleep 30"), cwd=tmp_path)
        await asyncio.wait_for(running.stdout.readline(), timeout=30)  # the kills were read before this launch
        assert stranger.poll() is None, "the server killed a process it did not fork"
        spawner._kill(running.pid)
        assert await asyncio.wait_for(running.wait(), timeout=30) == -signal.SIGKILL
    finally:
        stranger.kill()
        stranger.wait()
        spawner.stop()
