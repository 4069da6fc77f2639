"""The stack's fork server (services/stack/forkserver.py): a process forked from it is what `python -m` would have
started, its exit is the stack's to read, the server never holds what a child is given, and its children go with it."""

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.stack.forkserver import ForkedProcess, ForkServer
from services.stack.processes import Stack
from services.stack.settings import StackSettings
from tests.unit.test_stack_restart import CLUSTER

ROOT = Path(__file__).resolve().parents[2]
CHILD = [sys.executable, "-m", "tests.unit.forkchild"]


@pytest.fixture
def server(tmp_path):
    forks = ForkServer(base_env(), cwd=ROOT, log=tmp_path / "fork-server.log")
    yield forks
    forks.stop()


def base_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": str(ROOT)}


def spawn(server: ForkServer, tmp_path: Path, *args: str, env: dict[str, str] | None = None, **kw) -> ForkedProcess:
    with (tmp_path / "child.log").open("ab") as log:
        options = {"cwd": tmp_path, "umask": 0o027, "death_signal": signal.SIGKILL, "name": "child", **kw}
        return server.spawn([*CHILD, *args], env=env or base_env(), log=log.fileno(), **options)


def report(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "child.log").read_text().splitlines()[0])


def state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def until(check, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (done := check()):
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)
    return done


def test_a_forked_process_is_what_python_m_would_start(server, tmp_path):
    env = {**base_env(), "ONLY_THIS_CHILD": "yes"}
    process = spawn(server, tmp_path, "report", "two words", env=env)
    assert process.wait(timeout=20) == 3
    seen = report(tmp_path)
    assert seen["argv"] == ["report", "two words"] and seen["main"] == "__main__"
    assert seen["env"] == env  # its own environment, exactly: nothing of the server's, nothing of another child's
    assert seen["cwd"] == str(tmp_path) and seen["umask"] == 0o027
    assert seen["session"] and seen["stdin"] == ""  # a session of its own (killpg), nothing to read
    assert seen["frozen_preloaded"]  # the libraries came imported


def test_the_server_never_holds_a_childs_environment(server, tmp_path):
    secret = f"s3cr3t-{os.urandom(8).hex()}"
    env = {**base_env(), "TRAINMASTER_NATS_CREDS": secret}
    process = spawn(server, tmp_path, "report", env=env)
    assert process.wait(timeout=20) == 3 and report(tmp_path)["env"]["TRAINMASTER_NATS_CREDS"] == secret
    pid = server.process.pid
    assert secret.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    try:
        memory = server_memory(pid)
    except PermissionError:
        pytest.skip("this user may not read the server's memory")
    assert b"s3cr3t-" not in memory  # the child read its request itself: the server's heap never had it


def server_memory(pid: int) -> bytes:
    """Every readable private mapping of the process."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("r") or (len(fields) > 5 and fields[5].startswith("/")):
                continue  # files mapped read-only: code, not data
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except OSError:
                continue
    return b"".join(chunks)


def test_an_exit_waits_for_the_stack_to_read_it(server, tmp_path):
    process = spawn(server, tmp_path, "sleep")
    until(lambda: (tmp_path / "child.log").exists() and (tmp_path / "child.log").read_text())
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.2)
    os.kill(process.pid, signal.SIGKILL)
    until(lambda: state(process.pid) == "Z")  # ended, and not reaped: its pid is no one else's while unread
    time.sleep(0.3)
    assert state(process.pid) == "Z"
    assert process.wait(timeout=10) == -signal.SIGKILL
    until(lambda: state(process.pid) is None)  # read: the server reaped it
    process.kill()  # no longer signalled once its end was read


def test_a_status_the_stack_never_reads_leaves_the_server_serving(server, tmp_path):
    process = spawn(server, tmp_path, "report")
    pid = process.pid
    until(lambda: state(pid) == "Z")
    time.sleep(0.3)  # its status sent, unread: closing our end now resets the server's
    del process
    gc.collect()
    until(lambda: state(pid) is None)  # reaped
    again = spawn(server, tmp_path, "report")
    until(lambda: state(again.pid) == "Z")  # ended; the server tells it a moment later (later on a loaded machine)

    def read_without_waiting() -> bool:
        try:
            return again.wait(timeout=0) == 3  # an exit already told is read without waiting
        except subprocess.TimeoutExpired:  # not told yet
            return False

    until(read_without_waiting)
    assert server.process.poll() is None


def test_a_signal_reads_as_popen_reads_it(server, tmp_path):
    process = spawn(server, tmp_path, "sleep")
    until(lambda: (tmp_path / "child.log").exists() and (tmp_path / "child.log").read_text())
    process.terminate()
    assert process.wait(timeout=10) == -signal.SIGTERM and process.poll() == -signal.SIGTERM


def test_the_children_go_with_the_server(server, tmp_path):
    process = spawn(server, tmp_path, "sleep", death_signal=signal.SIGKILL)
    until(lambda: (tmp_path / "child.log").exists() and (tmp_path / "child.log").read_text())
    server.stop()  # as when the stack's process dies: its end of the socket closes
    assert process.wait(timeout=10) == -signal.SIGKILL
    until(lambda: state(process.pid) in (None, "Z"))


def test_the_stack_forks_python_modules_and_starts_anything_else_itself(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    settings = StackSettings(data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", mongo_url=None, nats_url=None)
    stack = Stack(settings)
    try:
        forked = stack._spawn("child", [*CHILD, "report"])
        other = stack._spawn("true", ["/bin/true"])
        elsewhere = stack._spawn("other-path", [*CHILD, "report"], env={**stack.env(), "PYTHONPATH": str(tmp_path)})
        assert isinstance(forked, ForkedProcess) and forked.wait(timeout=20) == 3
        assert isinstance(other, subprocess.Popen) and other.wait(timeout=10) == 0
        # another interpreter environment than the server's: a Python of its own, which imported nothing first
        assert isinstance(elsewhere, subprocess.Popen) and elsewhere.wait(timeout=20) == 3
        seen = json.loads((tmp_path / "logs" / "child.log").read_text().splitlines()[0])
        assert seen["env"]["TRAINMASTER_DATA_DIR"] == str(tmp_path.resolve()) and seen["frozen_preloaded"]
        apart = json.loads((tmp_path / "logs" / "other-path.log").read_text().splitlines()[0])
        assert apart["env"]["PYTHONPATH"] == str(tmp_path) and not apart["frozen_preloaded"]
    finally:
        stack.stop_all()
    assert stack.forks is None
    again = Stack(settings)
    try:
        first = again._spawn("child", [*CHILD, "sleep"])
        again.forks.process.kill()  # the server dies: its children with it, and the next process gets a new one
        assert first.wait(timeout=10) == -signal.SIGKILL
        assert isinstance(again._spawn("child", [*CHILD, "report"]), ForkedProcess)
        assert again.processes["child"].wait(timeout=20) == 3 and again.forks.process.poll() is None
    finally:
        again.stop_all()
    off = Stack(settings.model_copy(update={"fork_server": False}))
    plain = off._spawn("child", [*CHILD, "report"])
    assert isinstance(plain, subprocess.Popen) and plain.wait(timeout=30) == 3 and off.forks is None
