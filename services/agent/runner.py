"""One task as a real OS process: its own process group, its environment, its output line by line."""

import asyncio
import contextlib
import json
import logging
import os
import pwd
import re
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil

from shared.events import MAX_EXIT_MESSAGE, LogLine, StartTask
from shared.jobs import host_memory_gb
from shared.nodes import NodeInfo
from services.agent.carriage import UPDATE_EVERY_S, OutputSplitter
from services.agent.cgroups import TaskCgroup, kill_members, read_oom_kills
from services.agent.isolation import TaskUser, kill_user
from services.agent.jobsecrets import Masker
from services.agent.outputrate import Bucket
from services.agent.spawner import READ_LIMIT, SHIM, ShimProcess, SpawnerGone, spawner
from services.agent.taskenv import PROGRESS_FILE, collective_defaults
from services.agent.transfers import Progress

TAIL_LINES = 20
TAIL_LINE_CHARS = 2000  # of each (a line is up to a MiB): the end's message fits a bus message and a job's status
# The only variables a task inherits from the agent's environment (an allow-list: whatever else the agent holds,
# credentials included, never reaches a task); the job's own variables and ours are added after.
INHERITED_ENV = frozenset(
    {
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "LD_LIBRARY_PATH",
        "CUDA_HOME",
        "CUDA_PATH",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "HIP_VISIBLE_DEVICES",
    }
)
INHERITED_ENV_PREFIXES = ("LC_",)
SDK_DIR = Path(__file__).resolve().parent / "sdk"
GPU_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
    r"|RESOURCE_EXHAUSTED: Out of memory|HIP out of memory"
)
HOST_OOM = re.compile(r"^(\w+\.)*MemoryError\b|std::bad_alloc")
OOM_MARKERS = ("emory", "ALLOC", "bad_alloc")  # every match of the two patterns holds one of these
OOM_BYTES = tuple(m.encode() for m in OOM_MARKERS)


def oom_in(line: str) -> str | None:
    """ "gpu" or "host" where the line says the task ran out of that memory; None otherwise."""
    return "gpu" if GPU_OOM.search(line) else "host" if HOST_OOM.search(line) else None


OOM_LOOKS = 64  # lines holding a marker read for the patterns per read, while the output allowance is spent
OOM_SPAN = 2**16  # an unended line's bytes carried over a read and looked at with it
MEMORY_CHECK_S = 0.5
EXIT_POLL_S = 0.05
DRAIN_S = 2.0  # once the task's processes are dead, what they printed is read within this
READ_BYTES = 2**16  # a read of a task's output
SPENT_READ_BYTES, SPENT_PAUSE_S = 2**20, 0.05  # while its allowance is spent: 20 MiB/s read (and dropped) at most
READ_BYTES_PER_S = 32 * 2**20  # a stream of a task's output is read no faster than this, whatever it is
TASK_MARKER = "TRAINMASTER_TASK_INSTANCE"  # in every task process's environment: found even outside its group

log = logging.getLogger(__name__)


def agent_account() -> str:
    """The agent's own user name (tasks run as it when the agent is not root)."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def identity(account: str, workdir: Path) -> dict[str, str]:
    """Who the task is and where its caches go (PyTorch's compilers, Triton, XDG): all in its own directory."""
    cache = workdir / ".cache"
    return {
        "USER": account,
        "LOGNAME": account,
        "HOME": str(workdir),
        "XDG_CACHE_HOME": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }


def job_variables(start: StartTask) -> dict[str, str]:
    """The variables the job sets itself: its parameters, then its environment."""
    return {**{p.name: p.value for p in start.algorithm.parameters}, **start.algorithm.environments}


def task_environment(
    start: StartTask,
    node: NodeInfo,
    *,
    workdir: Path,
    base: dict[str, str],
    sdk_dir: Path = SDK_DIR,
    account: str | None = None,
) -> dict[str, str]:
    """The task's environment: the allowed part of the agent's, parameters, the job's variables, ours last
    (`account`: the task user's name; the agent's own when None)."""
    gpus = [g for g in node.gpus if g.index in start.gpu_indices]
    env = {k: v for k, v in base.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}
    env.setdefault("PATH", os.defpath)
    own = job_variables(start)
    env.update(collective_defaults(own))
    env.update({p.name: p.value for p in start.algorithm.parameters})
    env.update(start.algorithm.environments)
    env.update(identity(account or agent_account(), workdir))
    env.update(
        {
            "TMPDIR": str(workdir / "tmp"),
            "TRAINMASTER_JOB_ID": start.job_id,
            "TRAINMASTER_PROJECT_ID": start.project_id,
            "TRAINMASTER_ATTEMPT": str(start.attempt),
            "TRAINMASTER_NODE_ID": node.node_id,
            "TRAINMASTER_WORK_DIR": str(workdir),
            "TRAINMASTER_CHECKPOINT_DIR": str(workdir / "checkpoint"),
            "TRAINMASTER_PROGRESS_FILE": str(workdir / PROGRESS_FILE),
            "PYTHONPATH": os.pathsep.join(p for p in (str(sdk_dir), env.get("PYTHONPATH", "")) if p),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # CUDA_VISIBLE_DEVICES then counts GPUs as NVML (and we) do
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in start.gpu_indices),
            "TRAINMASTER_GPU_MODEL": gpus[0].model if gpus else "",
            "TRAINMASTER_GPU_MEMORY_GB": f"{min(g.memory_gb for g in gpus):g}" if gpus else "0",
            "RANK": str(start.rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(start.world_size),
            "MASTER_ADDR": start.master_addr,
            "MASTER_PORT": str(start.master_port),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class OutputGate(Protocol):
    """Whether a task's output allowance is spent for now, and the count of lines dropped unsplit."""

    def spent(self) -> bool: ...

    def drop(self, lines: int) -> None: ...


@dataclass
class TaskProcess:
    """A started task; `stop_reason` is set once the agent decided to stop it."""

    start: StartTask
    process: "asyncio.subprocess.Process | ShimProcess"
    workdir: Path
    user: TaskUser | None = None
    cgroup: TaskCgroup | None = None
    joined: Path | None = None  # created by the shim once it is in the task's cgroups
    isolated: Path | None = None  # created by the shim once the task's own namespaces and view are made
    started_at: float = field(default_factory=time.time)
    stop_reason: str | None = None
    oom: str | None = None
    disk_full: bool = False  # wrote more than its disk quota to its working directory
    manifest: dict = field(default_factory=dict)
    uploaded: dict[str, dict] = field(default_factory=dict)
    unmirrored: dict[str, tuple[float, str]] = field(default_factory=dict)  # folders found too full: when, why
    note: Callable[[str], None] | None = None  # a line of the agent's own in the task's output, while it is shipped
    transferring: asyncio.Lock = field(default_factory=asyncio.Lock)  # one of its copies to storage at a time
    copying: Progress = field(default_factory=Progress)  # when its copies last moved a byte
    tail: "Tail" = field(default_factory=lambda: Tail(TAIL_LINES))
    marker: str = ""
    stop_grace_s: float = 0.0  # of the stop under way: how long the task may take to end after its SIGTERM
    last_output: float = field(default_factory=time.monotonic)  # for hang detection
    update_every_s: float = UPDATE_EVERY_S  # a redrawn bar's latest frame goes out at most this often
    drained: bool = False  # its output is no longer read: nothing more is forwarded
    _held: bool | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def in_cgroup(self) -> bool:
        """Whether the shim has joined the task's cgroup (so far): from then on its limit holds the whole task."""
        return self._held if self._held is not None else self._joined_now()

    def held_by_cgroup(self) -> bool:
        """Whether the task's cgroup holds every process of the task, asked once its shim ended: the shim joined it
        before it started anything (its `joined` file says so; only the agent's user can write there), a task's
        user cannot move a process out of it, and what a process forks stays in it."""
        if self._held is None:
            self._held = self._joined_now()
            if self.joined is not None:
                self.joined.unlink(missing_ok=True)
        return self._held

    def ran_isolated(self) -> bool:
        """Whether the task ran in mount, IPC and PID namespaces of its own with its private temporary folders,
        asked once its shim ended (its `isolated` file, in the agent's private launch directory, says so): nothing
        it made in temporary folders or System V IPC outlives it but message queues made through the host's
        /dev/mqueue, so its uid's sweep looks there alone (`leftovers.sweep`)."""
        if self.isolated is None:
            return False
        made = self.isolated.exists()
        self.isolated.unlink(missing_ok=True)
        self.isolated = None
        return made

    def _joined_now(self) -> bool:
        return self.cgroup is not None and self.joined is not None and self.joined.exists()

    async def pump(self, on_line: Callable[[LogLine], None], *, gate: "OutputGate | None" = None) -> int:
        """Forward every output line until the shim ends, then kill what is left of the task and forward what it
        had printed; return the shim's exit status (the command's, or the signal that killed the shim).

        The shim's end is the task's end: a shim killed from outside (the OOM killer, an operator) takes its task
        with it here at once, so nothing of it runs on, holding its GPUs, and no line of it comes after its end.
        A shim that ended with its command leaves the rest of the task a moment to end on its own (a process still
        saving after the SIGTERM that ended the shell above it: the stop's grace period), then kills it."""
        stdout, stderr = self.process.stdout, self.process.stderr
        if stdout is None or stderr is None:
            raise RuntimeError("the shim was started without pipes for its output")
        readers = [
            asyncio.create_task(self._read(stdout, "out", on_line, gate)),
            asyncio.create_task(self._read(stderr, "err", on_line, gate)),
        ]
        status = await self._ended()
        if status != -signal.SIGKILL:
            await asyncio.wait(readers, timeout=self.stop_grace_s if self.stop_reason is not None else DRAIN_S)
        await asyncio.to_thread(
            kill_tree,
            self.process.pid,
            uid=self.user.uid if self.user else None,
            marker=self.marker,
            cgroup=self.cgroup if self.held_by_cgroup() else None,
        )
        _, late = await asyncio.wait(readers, timeout=DRAIN_S)
        self.drained = True  # nothing it prints from here on is forwarded (a cancel a read's result swallowed
        for reader in late:  # left a reader writing into the closed log); something outside the task's group, uid
            reader.cancel()  # and environment holds its output: not read
        if isinstance(self.process, ShimProcess):
            self.process.close()
        return status

    async def _ended(self) -> int:
        """The shim's exit status, as soon as it exits (`process.wait()` also waits for its output pipes to close,
        which a leftover of the task holding them would put off for ever)."""
        while self.process.returncode is None:
            await asyncio.sleep(EXIT_POLL_S)
        return self.process.returncode

    async def _read(
        self, stream: asyncio.StreamReader, name: str, on_line: Callable[[LogLine], None], gate: "OutputGate | None"
    ) -> None:
        """Forward the stream's lines; a bar redrawn with carriage returns as its latest frame now and then
        (`carriage.OutputSplitter`). While the task's output allowance is spent (`gate`), what it prints is dropped
        unsplit, its lines counted (a task printing as fast as it could held a core of the agent, its loop late by
        a tenth of a second, splitting lines it then dropped); its last lines are kept for its end's message, and a
        read that may hold an out-of-memory message is split as usual."""
        splitter = OutputSplitter(every_s=self.update_every_s)
        splitter.whole = self.tail.mask.encoded() if self.tail.mask is not None else ()  # no cut splits a secret
        pace = Bucket(rate=READ_BYTES_PER_S, capacity=READ_BYTES_PER_S)  # what is read of it, whatever is shipped
        while not self.drained:
            size = SPENT_READ_BYTES if gate is not None and gate.spent() else READ_BYTES
            try:
                raw = await asyncio.wait_for(stream.read(size), timeout=splitter.every_s)
            except TimeoutError:  # quiet: a held bar frame goes out once due
                self._forward(splitter.due(time.monotonic()), name, on_line)
                continue
            if not raw:
                self._forward(splitter.end(), name, on_line)
                return
            self.last_output = time.monotonic()
            pace.refill(self.last_output)
            pace.tokens -= len(raw)
            if pace.tokens < 0:  # past READ_BYTES_PER_S (a bar redrawn in a tight loop ships a frame now and then,
                await asyncio.sleep(-pace.tokens / pace.rate)  # but was read as fast as it came): it waits on its pipe
            if gate is not None and gate.spent():
                if self.oom is None:  # the lines holding a marker (one may span two reads) read for an OOM message
                    self._look_for_oom(splitter.partial + raw if len(splitter.partial) < OOM_SPAN else raw)
                if (skipped := splitter.skip(raw)) is not None:
                    lines, last = skipped
                    gate.drop(lines)
                    # its first piece may begin within a line (a secret's end, unmasked): left out
                    self.tail.extend(last.decode(errors="replace").replace("\r", "\n").split("\n")[1:][-TAIL_LINES:])
                else:  # no line or frame ended: a long piece, few of them
                    self._forward(splitter.feed(raw, self.last_output), name, on_line)
                await asyncio.sleep(SPENT_PAUSE_S)  # no faster than SPENT_READ_BYTES a SPENT_PAUSE_S: past that
                continue  # the task waits on its full pipe, not the agent on its output
            self._forward(splitter.feed(raw, self.last_output), name, on_line)

    def _look_for_oom(self, data: bytes) -> None:
        """Read the lines of `data` that hold an out-of-memory marker (at most `OOM_LOOKS` a read) for the
        out-of-memory patterns."""
        looks = 0
        for marker in OOM_BYTES:
            at = data.find(marker)
            while at >= 0 and looks < OOM_LOOKS and self.oom is None:
                looks += 1
                begin, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
                self.oom = oom_in(data[begin : end if end >= 0 else len(data)].decode(errors="replace"))
                at = data.find(marker, end) if end >= 0 else -1

    def _forward(self, lines: list[str], name: str, on_line: Callable[[LogLine], None]) -> None:
        if not lines or self.drained:
            return
        now = time.time()  # the batch's lines were read together
        # the out-of-memory patterns only where a line may hold one: a task printing as fast as it could held the
        # agent's loop with two searches a line before its output allowance dropped the line (found by review)
        look = self.oom is None and any(marker in line for line in lines for marker in OOM_MARKERS)
        for line in lines:
            self.tail.append(line)
            if look and self.oom is None:
                self.oom = oom_in(line)
            on_line(LogLine(t=now, s=name, line=line))

    async def stop(self, *, reason: str, grace_s: float) -> None:
        """SIGTERM the whole group, wait the grace period, then SIGKILL whatever is left."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_grace_s = reason, grace_s
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout=grace_s)
        except TimeoutError:
            pass
        self._signal_group(signal.SIGKILL)

    async def enforce_memory(self, limit_gb: float) -> None:
        """Kill the whole task when its processes together use more than the memory it asked for: its cgroup's
        limit, enforced by the kernel, once the shim joined it (a kill there ends the whole task); else (no cgroup,
        or one the shim could not join) measured here. The first look comes after a moment: the shim joins its
        cgroup as it starts."""
        limit = limit_gb * 2**30
        while self.process.returncode is None:
            await asyncio.sleep(MEMORY_CHECK_S)
            if self.process.returncode is not None:
                return
            if self.in_cgroup():
                if self.out_of_memory(limit_gb):
                    self._signal_group(signal.SIGKILL)
                    return
            elif (used := group_rss(self.process.pid)) > limit:
                self.oom = "host"
                self.tail.append(
                    f"killed by trainmaster: out of memory: the task used {used / 2**30:.2f} GB of host "
                    f"memory, more than the {limit_gb:g} GB it was given (spec.resource.memory_gb)"
                )
                self._signal_group(signal.SIGKILL)
                return

    def out_of_memory(self, limit_gb: float) -> bool:
        """Whether the kernel killed a process of the task's cgroup for memory (noted once)."""
        if self.oom != "host" and self.cgroup is not None and read_oom_kills(self.cgroup) > 0:
            self.oom = "host"
            self.tail.append(
                f"killed by trainmaster: out of memory: the task's processes reached the {limit_gb:g} GB "
                "of host memory it was given (spec.resource.memory_gb; /dev/shm and detached processes "
                "included)"
            )
        return self.oom == "host"

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            # No group yet: a shim forked by the shim server is told as started before it makes its session. Not
            # yet ended, it is signalled alone (it has started nothing, and dies of it); a stop there was lost, and
            # the task ran until the stop's grace ran out (found by review).
            if self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, sig)


def kill_tree(leader: int, *, uid: int | None, marker: str, cgroup: TaskCgroup | None = None) -> None:
    """SIGKILL what is left of a task: its process group and, given the cgroup that holds every process of the
    task, the processes listed there; else every process of its uid (a task user's) and every process carrying its
    marker in its environment (descendants that left the group, when tasks share the agent's uid), each found by
    looking through every process of the host."""
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if cgroup is not None:
        try:
            kill_members(cgroup)
            return
        except OSError as exc:  # it cannot answer after all: every process is looked at, as without one
            log.warning("the processes of the task cgroup %s could not be read: %r", cgroup.dirs, exc)
    if uid is not None:
        kill_user(uid)
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get(TASK_MARKER) == marker:
                process.kill()
        except psutil.Error:
            pass


def memory_limit_gb(start: StartTask, node: NodeInfo) -> float:
    """The host memory a task may use: what placement launched it with (a command from before placement decided
    it: its GPUs' share of this node, or the CPU job's default)."""
    return host_memory_gb(
        start.spec.resource.memory_gb,
        gpus=len(start.gpu_indices),
        node_memory_gb=node.memory_gb,
        node_gpus=len(node.gpus),
    )


def group_rss(leader: int) -> int:
    """Resident bytes of a process and all its descendants."""
    try:
        root = psutil.Process(leader)
        total = 0
        for process in [root, *root.children(recursive=True)]:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0


def clear_launches(launch_dir: Path) -> list[str]:
    """Remove what an earlier run of the agent left in its launch directory, before this run launches anything:
    launch files no shim read and the `joined` and `isolated` markers of tasks that run died with (no live task
    owns them); the names removed."""
    removed = []
    for entry in os.scandir(launch_dir):
        if not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)
            removed.append(entry.name)
    return removed


async def spawn(
    start: StartTask,
    *,
    env: dict[str, str],
    workdir: Path,
    argv: str | None = None,
    launch_dir: Path,
    cpus: Sequence[int] = (),
    user: TaskUser | None = None,
    reach: Sequence[str] = (),
    cover: dict[str, int] | None = None,
    cgroup: TaskCgroup | None = None,
    tmpfs_bytes: int | None = None,
    shm_bytes: int | None = None,
    file_size: int | None = None,
    links: dict[str, str] | None = None,
    hidden: Sequence[str] = (),
) -> TaskProcess:
    """Start the task's command under the shim, as the leader of a new process group (as `user` when given), on
    the CPUs `cpus` (its affinity; empty: wherever the agent may run).

    The shim is run by file path in isolated mode with an empty environment: the job's variables (LD_PRELOAD, say)
    reach only the command, never the shim, which keeps the agent's privileges. They travel in a 0600 file of the
    agent's own directory, not in the command line (every user can read those)."""
    workdir.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    joined = launch_dir / f"{marker}.joined" if cgroup else None
    isolated = launch_dir / f"{marker}.isolated" if user else None
    launch = {
        "command": argv or start.algorithm.command,
        "env": {**env, TASK_MARKER: marker},
        "cwd": str(workdir),
        "cpus": list(cpus),
        "user": {"uid": user.uid, "gid": user.gid, "name": env.get("USER", "")} if user else None,
        "reach": list(reach),
        "cover": cover or {},
        "cgroup_procs": cgroup.procs_files if cgroup else [],
        "cgroup_joined": str(joined) if joined else None,
        "isolated": str(isolated) if isolated else None,
        "tmpfs_size": tmpfs_bytes,
        "shm_size": shm_bytes,  # /dev/shm's own size, used where the task joins its cgroup (it counts it there)
        "file_size": file_size,
        "links": links or {},  # made again inside the task's private /tmp (services/agent/tmplink.py)
        "hidden": list(hidden),  # other GPUs' device files, unreadable in its view (services/agent/gpudevices.py)
    }
    path = launch_dir / f"{uuid.uuid4().hex}.json"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(json.dumps(launch))  # the C encoder: json.dump encodes in Python (~130 against ~40 µs a launch)
    try:
        process = await start_shim(path, cwd=workdir)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return TaskProcess(
        start=start,
        process=process,
        workdir=workdir,
        user=user,
        cgroup=cgroup,
        joined=joined,
        isolated=isolated,
        marker=marker,
    )


async def start_shim(launch: Path, *, cwd: Path) -> "asyncio.subprocess.Process | ShimProcess":
    """The shim of launch file `launch`, forked by the agent's shim server (`services/agent/spawner.py`), or
    started as a Python of its own where the server cannot be reached."""
    try:
        return await spawner().start(launch, cwd=cwd)
    except SpawnerGone as exc:
        log.warning("%s; this task's shim is started on its own", exc)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",  # standard library only: no site-packages (their .pth files and finders cost ~40 ms of CPU a task)
        str(SHIM),
        str(launch),
        str(os.getpid()),
        cwd=cwd,
        env={"PATH": os.defpath},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        limit=READ_LIMIT,
    )


class Tail(deque[str]):
    """A task's last lines of output for its end's message, its secrets masked as each line comes in (before any
    line is cut: a cut could leave part of a value the mask no longer recognises)."""

    def __init__(self, maxlen: int) -> None:
        super().__init__(maxlen=maxlen)
        self.mask: Masker | None = None  # the task's secrets (`jobsecrets.Masker`), set before its output is read

    def append(self, line: str) -> None:
        super().append(self.mask(line) if self.mask is not None else line)

    def extend(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.append(line)


def describe_exit(status: int, tail: deque[str]) -> str:
    """A failure message: how it ended and the last lines it printed."""
    how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exited with code {status}"
    lines = [line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS] + " …" for line in tail][-TAIL_LINES:]
    while lines and sum(len(line) + 1 for line in lines) > MAX_EXIT_MESSAGE - 64:  # the last lines kept
        lines.pop(0)
    last = "\n".join(lines)
    return f"{how}; last output:\n{last}" if last else how
