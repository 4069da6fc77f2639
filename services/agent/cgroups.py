"""A cgroup per task: its memory (swap included), its number of processes and its CPU time (`cpu_count` CPUs' worth:
cpu.max, or v1's CFS quota) limited, its out-of-memory kills counted, and the whole cgroup killed and removed when
the task ends.

cgroup v2 (the unified hierarchy, with its memory controller) or v1 (the memory, pids and cpu hierarchies), found at
run time; the pids and cpu controllers where the host has them (without cpu, a task is held to its CPUs by its
affinity alone, `services/agent/cpus.py`). Task cgroups sit under the agent's own cgroup, so whatever limits the
agent limits its tasks too (on v2 the agent first moves itself into a leaf `agent`, as a delegated service must).
Without a writable hierarchy (not root, a container) there are none, and the agent measures its tasks' memory itself.
"""

import logging
import os
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

log = logging.getLogger(__name__)

TASKS = "trainmaster-tasks"
KILL_WAIT_S = 5.0
CPU_PERIOD_US = 100_000  # the CFS period a task's CPU quota is counted over (the kernel's default)
CPU_QUOTA_MIN_US = 1_000  # the least quota the kernel takes a period


@dataclass(frozen=True)
class Layout:
    """Where task cgroups go: one parent per hierarchy (v2: one; v1: memory and pids)."""

    version: int
    memory: Path
    pids: Path | None
    agent_leaf: Path | None = None  # v2: where the agent moves itself before it enables controllers below
    enable: str = "+memory +pids"  # v2: the controllers enabled below the agent (pids and cpu where available)
    cpu: Path | None = None  # v1: the cpu hierarchy's parent of task cgroups (v2: "+cpu" in `enable`)

    @property
    def limits_cpu(self) -> bool:
        return self.cpu is not None if self.version == 1 else "+cpu" in self.enable.split()

    def without_cpu(self) -> "Layout":
        """The same, the cpu controller left out (the host would not hand it down)."""
        enable = " ".join(c for c in self.enable.split() if c != "+cpu")
        return replace(self, cpu=None, enable=enable)


@dataclass(frozen=True)
class TaskCgroup:
    """One task's cgroups and what was written to them."""

    dirs: tuple[Path, ...]
    limits: tuple[tuple[Path, str], ...]
    oom_file: Path  # memory.events (v2) or memory.oom_control (v1): its `oom_kill` line counts the kills

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]


def own_cgroups(text: str) -> dict[str, str]:
    """This process's cgroup path by controller ("" for v2) from /proc/self/cgroup."""
    own = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller.removeprefix("name=")] = path
    return own


def cgroup_mounts(text: str) -> dict[str, Path]:
    """Mount points by controller ("" for the v2 hierarchy) from /proc/self/mounts."""
    mounts: dict[str, Path] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2":
            mounts.setdefault("", Path(fields[1]))
        elif fields[2] == "cgroup":
            for option in fields[3].split(","):
                if option in ("memory", "pids", "cpu"):
                    mounts.setdefault(option, Path(fields[1]))
    return mounts


def choose_layout(*, mounts: dict[str, Path], own: dict[str, str], v2_controllers: set[str]) -> Layout | None:
    """v2 when the agent's own cgroup may hand down the memory controller (`v2_controllers`: its
    cgroup.controllers), else v1 when memory is mounted; None without either."""
    if "" in mounts and "memory" in v2_controllers:
        base = mounts[""] / own.get("", "/").lstrip("/")
        leaf = None if own.get("", "/") == "/" else base / "agent"
        enable = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in v2_controllers)
        return Layout(version=2, memory=base / TASKS, pids=None, agent_leaf=leaf, enable=enable)
    if "memory" in mounts:

        def under(controller: str) -> Path | None:
            if controller not in mounts:
                return None
            return mounts[controller] / own.get(controller, "/").lstrip("/") / TASKS

        memory = under("memory")
        assert memory is not None
        return Layout(version=1, memory=memory, pids=under("pids"), cpu=under("cpu"))
    return None


def cpu_quota_us(cpu_count: float) -> int:
    """A period's CPU time for `cpu_count` CPUs (at least the kernel's least)."""
    return max(CPU_QUOTA_MIN_US, round(cpu_count * CPU_PERIOD_US))


def plan(layout: Layout, *, name: str, memory_bytes: int, pids_max: int, cpu_count: float | None = None) -> TaskCgroup:
    """The task's cgroup directories and the limits to write, in order (`cpu_count`: its CPU time capped at that
    many CPUs where the layout has the cpu controller; None: not capped)."""
    quota = cpu_quota_us(cpu_count) if cpu_count is not None and layout.limits_cpu else None
    if layout.version == 2:
        cg = layout.memory / name
        limits = [
            (cg / "memory.max", str(memory_bytes)),
            (cg / "memory.swap.max", "0"),
            (cg / "memory.oom.group", "1"),
            (cg / "pids.max", str(pids_max)),
        ]
        if quota is not None:
            limits.append((cg / "cpu.max", f"{quota} {CPU_PERIOD_US}"))
        return TaskCgroup(dirs=(cg,), oom_file=cg / "memory.events", limits=tuple(limits))
    memory = layout.memory / name
    limits = [
        (memory / "memory.limit_in_bytes", str(memory_bytes)),
        (memory / "memory.memsw.limit_in_bytes", str(memory_bytes)),
    ]
    dirs = [memory]
    if layout.pids is not None:
        dirs.append(layout.pids / name)
        limits.append((layout.pids / name / "pids.max", str(pids_max)))
    if layout.cpu is not None and quota is not None:
        dirs.append(layout.cpu / name)
        limits.append((layout.cpu / name / "cpu.cfs_period_us", str(CPU_PERIOD_US)))
        limits.append((layout.cpu / name / "cpu.cfs_quota_us", str(quota)))
    unique = tuple(dict.fromkeys(dirs))  # one hierarchy may carry several controllers (`cpu,memory`): one directory
    return TaskCgroup(dirs=unique, limits=tuple(limits), oom_file=memory / "memory.oom_control")


def oom_kills(text: str) -> int:
    """The `oom_kill` count of a memory.events or memory.oom_control file."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


class Cgroups:
    """Creates, watches and removes task cgroups on this host's hierarchy."""

    def __init__(self, layout: Layout, *, pids_max: int) -> None:
        self.pids_max = pids_max
        self.layout = layout.without_cpu()
        if self.layout.version == 2:
            self._delegate(self.layout)
        for parent in (self.layout.memory, self.layout.pids):
            if parent is not None:
                parent.mkdir(exist_ok=True)
        if self.layout.version == 2:
            (self.layout.memory / "cgroup.subtree_control").write_text(self.layout.enable)
        if layout.limits_cpu:
            try:
                self._add_cpu(layout)
                self.layout = layout
            except OSError as exc:  # memory and processes are still limited
                log.warning("task CPU time cannot be capped here (%r): only pinned tasks are held to their CPUs", exc)

    @staticmethod
    def _delegate(layout: Layout) -> None:
        """v2 lets a cgroup with processes have no controlled children: the agent moves into a leaf first."""
        top = layout.memory.parent
        if layout.agent_leaf is not None:
            layout.agent_leaf.mkdir(exist_ok=True)
            (layout.agent_leaf / "cgroup.procs").write_text(str(os.getpid()))
        (top / "cgroup.subtree_control").write_text(layout.enable)

    @staticmethod
    def _add_cpu(layout: Layout) -> None:
        """The cpu controller for task cgroups: v1's parent made, v2's enabled on the way down (v2 refuses it with a
        real-time process in the subtree; a v1 hierarchy may be read-only)."""
        if layout.version == 1:
            assert layout.cpu is not None
            layout.cpu.mkdir(exist_ok=True)
            return
        for parent in (layout.memory.parent, layout.memory):
            (parent / "cgroup.subtree_control").write_text("+cpu")

    def create(self, *, name: str, memory_gb: float, cpu_count: float | None = None) -> TaskCgroup | None:
        """A fresh cgroup for one task (a leftover of the same name, from an agent that died, removed first), its
        CPU time capped at `cpu_count` CPUs where the host has the cpu controller; a cap the kernel refuses (v1: above
        a quota of the agent's own cgroup) is left out, the rest kept. None (logged) when the hierarchy refuses the
        cgroup: the agent then measures the task's memory itself."""
        memory_bytes = int(memory_gb * 2**30)
        cg = plan(self.layout, name=name, memory_bytes=memory_bytes, pids_max=self.pids_max, cpu_count=cpu_count)
        try:
            self._make(cg)
        except OSError as exc:
            remove(cg)
            if cpu_count is None or not self.layout.limits_cpu:
                log.warning("no cgroup for task %s (%r): its memory is measured by the agent", name, exc)
                return None
            log.warning(
                "task %s: its CPU time cannot be capped at %g CPUs (%r); made without the cap", name, cpu_count, exc
            )
            return self.create(name=name, memory_gb=memory_gb)
        return cg

    @staticmethod
    def _make(cg: TaskCgroup) -> None:
        remove(cg)
        for d in cg.dirs:
            d.mkdir()
        for path, value in cg.limits:
            if path.exists():  # memsw only where swap accounting is on
                path.write_text(value)


def read_oom_kills(cg: TaskCgroup) -> int:
    try:
        return oom_kills(cg.oom_file.read_text())
    except OSError:
        return 0


def nested(top: Path) -> list[Path]:
    """`top` and every cgroup below it, deepest first (the order they can be removed in); FileNotFoundError when
    `top` is no cgroup (a listing of nothing must not read as a cgroup without processes). A nested cgroup removed
    meanwhile is left out."""
    if not (top / "cgroup.procs").is_file():
        raise FileNotFoundError(f"no cgroup at {top}")

    def fail(exc: OSError) -> None:
        if not (isinstance(exc, FileNotFoundError) and exc.filename != str(top)):
            raise exc

    return [Path(root) for root, _, _ in os.walk(top, topdown=False, onerror=fail)]


def procs(top: Path) -> set[int]:
    """Every process in the cgroup `top` and those nested below it (OSError where one cannot be read; a nested
    cgroup removed meanwhile has none)."""
    found: set[int] = set()
    for group in nested(top):
        try:
            found.update(int(pid) for pid in (group / "cgroup.procs").read_text().split())
        except FileNotFoundError:
            if group == top:
                raise
    return found


def kill_all(top: Path) -> None:
    """SIGKILL every process of the cgroup `top` (nested ones included) until none is left: what one forks while
    it dies is in the cgroup too, and found by the next look. OSError where it cannot be read."""
    if (top / "cgroup.kill").exists():  # v2: the kernel kills the whole subtree
        (top / "cgroup.kill").write_text("1")
    deadline = time.monotonic() + KILL_WAIT_S
    while (pids := procs(top)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def kill_members(cg: TaskCgroup) -> None:
    """SIGKILL every process of the task's cgroups (OSError where one cannot be read)."""
    for d in cg.dirs:
        kill_all(d)


def remove(cg: TaskCgroup) -> bool:
    """Kill every process in the task's cgroups (nested ones included), then remove them; whether none is left
    (False, logged, when one could not be emptied or removed: a process may still be in it)."""
    gone = True
    for d in cg.dirs:
        try:
            kill_all(d)
            groups = nested(d)
        except OSError as exc:
            if not (d / "cgroup.procs").exists():  # never made, or gone already
                continue
            log.warning("could not empty the task cgroup %s: %r", d, exc)
            gone = False
            continue
        for group in groups:
            try:
                group.rmdir()
            except FileNotFoundError:  # a nested one removed meanwhile
                pass
            except OSError as exc:
                log.warning("could not remove the task cgroup %s: %r", group, exc)
                gone = False
    return gone


def detect(*, pids_max: int, enabled: bool = True, proc: Path = Path("/proc/self")) -> Cgroups | None:
    """This host's task cgroups, or None (logged once) where none can be made."""
    if not enabled:
        return None
    try:
        mounts = cgroup_mounts((proc / "mounts").read_text())
        own = own_cgroups((proc / "cgroup").read_text())
        v2: set[str] = set()
        if "" in mounts:  # what the agent's own cgroup has from its parent, not what the root has
            here = mounts[""] / own.get("", "/").lstrip("/")
            v2 = set((here / "cgroup.controllers").read_text().split())
        layout = choose_layout(mounts=mounts, own=own, v2_controllers=v2)
        if layout is None:
            if "" in mounts and "memory" in (mounts[""] / "cgroup.controllers").read_text().split():
                log.warning(
                    "the memory controller is not delegated to the agent's cgroup %s (it has: %s): task memory is "
                    "measured by the agent; delegate it (systemd: Delegate=yes) for a cgroup per task",
                    here,
                    " ".join(sorted(v2)) or "none",
                )
            else:
                log.warning("no cgroup hierarchy with a memory controller: task memory is measured by the agent")
            return None
        return Cgroups(layout, pids_max=pids_max)
    except OSError as exc:
        log.warning("task cgroups cannot be made here (%s): task memory is measured by the agent", exc)
        return None
