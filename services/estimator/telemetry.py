"""A job's GPU telemetry: which readings of a sample are believed, and the system series they make (pure)."""

from collections.abc import Iterable, Mapping
from typing import Any

from shared.events import GpuReading, TaskTelemetry
from shared.origin import Given
from shared.rpc import MetricSeries

MEMORY_SLACK_GB = 0.1  # a GPU's recorded memory is NVML's total rounded to 0.1 GB
# The system series, in the order shown, with what one sample of a rank's GPUs contributes to each.
SERIES = ("gpu_util", "gpu_memory_gb", "gpu_memory_peak_gb", "gpu_power_w", "gpu_temp_c", "gpu_process_memory_gb")
PEAK = "gpu_memory_peak_gb"


def believed(sample: TaskTelemetry, given: Given | None) -> tuple[GpuReading, ...]:
    """The readings of GPUs placement gave the rank, each within the recorded memory; none when its GPUs are not
    known (a placement without them)."""
    if given is None:
        return ()
    most = given.gpu_memory_gb + MEMORY_SLACK_GB if given.gpu_memory_gb > 0 else None
    return tuple(g for g in sample.gpus if g.index in given.gpu_indices and (most is None or g.memory_used_gb <= most))


def believed_process_memory(sample: TaskTelemetry, given: Given | None) -> float | None:
    """The GPU memory the task's processes hold, when it fits in the GPUs placement gave the rank."""
    if given is None or sample.process_memory_gb is None or not given.gpu_indices:
        return None
    most = given.gpu_memory_gb * len(given.gpu_indices) + MEMORY_SLACK_GB
    return sample.process_memory_gb if given.gpu_memory_gb <= 0 or sample.process_memory_gb <= most else None


def summary(gpus: tuple[GpuReading, ...], process_memory_gb: float | None = None) -> dict[str, float | None]:
    """One sample of a rank's GPUs: mean utilisation, the fullest GPU's memory, total power, hottest GPU, and the
    memory its own processes hold (where NVML reports it)."""
    powers = [g.power_w for g in gpus if g.power_w is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    return {
        "gpu_util": round(sum(g.util_percent for g in gpus) / len(gpus), 3),
        "gpu_memory_gb": max(g.memory_used_gb for g in gpus),
        "gpu_power_w": round(sum(powers), 3) if powers else None,
        "gpu_temp_c": max(temps) if temps else None,
        "gpu_process_memory_gb": process_memory_gb,
    }


def system_series(samples: Iterable[Mapping[str, Any]], *, peak_before: float = 0.0) -> list[MetricSeries]:
    """The system series of stored samples (in time order); the peak is the highest memory so far, from
    `peak_before` (the peak of the samples older than these)."""
    points: dict[str, list[tuple[float, float, None]]] = {name: [] for name in SERIES}
    peak = peak_before
    for doc in samples:
        t = doc["t"]
        for name in SERIES:
            if name != PEAK and isinstance(doc.get(name), int | float):
                points[name].append((t, float(doc[name]), None))
        if isinstance(doc.get("gpu_memory_gb"), int | float):
            peak = max(peak, float(doc["gpu_memory_gb"]))
            points[PEAK].append((t, peak, None))
    return [MetricSeries(name=name, system=True, points=points[name]) for name in SERIES if points[name]]
