"""A running task's share of the node's GPU readings: one TaskTelemetry per task per heartbeat."""

from collections.abc import Iterable

import psutil

from shared.events import GpuReading, StartTask, TaskTelemetry
from services.agent.cgroups import TaskCgroup, procs


def task_samples(
    tasks: Iterable[tuple[StartTask, float | None]], gpus: tuple[GpuReading, ...], *, node_id: str, seq: int, t: float
) -> list[TaskTelemetry]:
    """For each task given GPUs (with the GPU memory its processes hold, where read), the readings of its own
    GPUs; a task none of whose GPUs was read gets no sample."""
    by_index = {g.index: g for g in gpus}
    samples = []
    for start, process_memory_gb in tasks:
        own = tuple(by_index[i] for i in start.gpu_indices if i in by_index)
        if own:
            samples.append(
                TaskTelemetry(
                    event_id=f"{start.job_id}:{start.attempt}:{start.rank}:gpu:{node_id}:{seq}",
                    job_id=start.job_id,
                    attempt=start.attempt,
                    rank=start.rank,
                    node_id=node_id,
                    seq=seq,
                    t=round(t, 3),
                    gpus=own,
                    process_memory_gb=process_memory_gb,
                )
            )
    return samples


def group_pids(leader: int, *, cgroup: TaskCgroup | None = None) -> set[int]:
    """A task's processes (host pids, as NVML names them): those of its cgroup where one holds every process of
    the task (a file read), else the leader and all its descendants (psutil walks every process of the host);
    empty once it is gone."""
    if cgroup is not None:
        try:
            return {pid for d in cgroup.dirs[:1] for pid in procs(d)}
        except OSError:  # it cannot answer after all: the processes are looked through, as without one
            pass
    try:
        root = psutil.Process(leader)
        return {root.pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return set()
