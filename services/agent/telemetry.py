"""A running task's share of the node's GPU readings: one TaskTelemetry per task per heartbeat (pure)."""
from collections.abc import Iterable

from shared.events import GpuReading, StartTask, TaskTelemetry


def task_samples(starts: Iterable[StartTask], gpus: tuple[GpuReading, ...], *, node_id: str, seq: int,
                 t: float) -> list[TaskTelemetry]:
    """For each task given GPUs, the readings of its own GPUs (a task with none read gets no sample)."""
    by_index = {g.index: g for g in gpus}
    samples = []
    for start in starts:
        own = tuple(by_index[i] for i in start.gpu_indices if i in by_index)
        if own:
            samples.append(TaskTelemetry(event_id=f"{start.job_id}:{start.attempt}:{start.rank}:gpu:{node_id}:{seq}",
                                         job_id=start.job_id, attempt=start.attempt, rank=start.rank,
                                         node_id=node_id, seq=seq, t=round(t, 3), gpus=own))
    return samples
