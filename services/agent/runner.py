"""One task as a real OS process: its own process group, its environment, its output line by line."""
import asyncio
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from shared.events import LogLine, StartTask
from shared.nodes import NodeInfo

TAIL_LINES = 20
# Agent settings that must not leak into a task's environment.
PRIVATE_ENV_PREFIXES = ("TRAINMASTER_", "MONGO_URL")


def task_environment(start: StartTask, node: NodeInfo, *, workdir: Path, base: dict[str, str]) -> dict[str, str]:
    """The task's environment: the agent's (minus its secrets), parameters, the job's variables, ours last."""
    gpus = [g for g in node.gpus if g.index in start.gpu_indices]
    env = {k: v for k, v in base.items() if not k.startswith(PRIVATE_ENV_PREFIXES)}
    env.update({p.name: p.value for p in start.algorithm.parameters})
    env.update(start.algorithm.environments)
    env.update({
        "TRAINMASTER_JOB_ID": start.job_id,
        "TRAINMASTER_PROJECT_ID": start.project_id,
        "TRAINMASTER_ATTEMPT": str(start.attempt),
        "TRAINMASTER_NODE_ID": node.node_id,
        "TRAINMASTER_WORK_DIR": str(workdir),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in start.gpu_indices),
        "TRAINMASTER_GPU_MODEL": gpus[0].model if gpus else "",
        "TRAINMASTER_GPU_MEMORY_GB": f"{min(g.memory_gb for g in gpus):g}" if gpus else "0",
        "RANK": str(start.rank),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(start.world_size),
        "MASTER_ADDR": start.master_addr,
        "MASTER_PORT": str(start.master_port),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@dataclass
class TaskProcess:
    """A started task; `stop_reason` is set once the agent decided to stop it."""

    start: StartTask
    process: asyncio.subprocess.Process
    workdir: Path
    started_at: float = field(default_factory=time.time)
    stop_reason: str | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def pid(self) -> int:
        return self.process.pid

    async def pump(self, on_line: Callable[[LogLine], None]) -> int:
        """Forward every output line until the process ends; return its exit status."""
        await asyncio.gather(self._read(self.process.stdout, "out", on_line),
                             self._read(self.process.stderr, "err", on_line))
        return await self.process.wait()

    async def _read(self, stream: asyncio.StreamReader, name: str, on_line: Callable[[LogLine], None]) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the reader's limit: take what is there
                raw = await stream.read(2**16)
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            on_line(LogLine(t=time.time(), s=name, line=line))

    async def stop(self, *, reason: str, grace_s: float) -> None:
        """SIGTERM the whole group, wait the grace period, then SIGKILL whatever is left."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._signal_group(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout=grace_s)
        except TimeoutError:
            pass
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass


async def spawn(start: StartTask, *, env: dict[str, str], workdir: Path) -> TaskProcess:
    """Start the task's command under the shim, as the leader of a new process group."""
    workdir.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.agent.shim", start.algorithm.command,
        cwd=workdir,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        limit=2**20,
    )
    return TaskProcess(start=start, process=process, workdir=workdir)


def describe_exit(status: int, tail: deque[str]) -> str:
    """A failure message: how it ended and the last lines it printed."""
    how = f"killed by {signal.Signals(-status).name}" if status < 0 else f"exited with code {status}"
    last = "\n".join(list(tail)[-TAIL_LINES:])
    return f"{how}; last output:\n{last}" if last else how
