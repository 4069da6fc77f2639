"""The node's one NVML reader (`nvidia-ml-py`, optional): each GPU's utilisation, memory, power and temperature.

Opened on first use; without the package or a driver it reads nothing (None, or no readings), once logged. The hang
detector and the heartbeat's telemetry read through the same probe.
"""

import logging
from collections.abc import Callable, Sequence
from typing import Any

from shared.events import GpuReading, readings

log = logging.getLogger(__name__)

GIB = 2**30


class GpuProbe:
    """This node's GPUs through NVML; nothing where they cannot be read (no package, no driver)."""

    def __init__(self) -> None:
        self._nvml = None
        self._broken = False

    def busiest(self, indices: Sequence[int]) -> float | None:
        """The highest utilisation (percent, over the driver's last sample period) of these GPUs."""
        nvml = self._open()
        if nvml is None or not indices:
            return None
        try:
            return float(
                max(nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(i)).gpu for i in indices)
            )
        except nvml.NVMLError as exc:
            log.warning("reading GPU utilisation failed: %r", exc)
            return None

    def read(self, indices: Sequence[int]) -> tuple[GpuReading, ...]:
        """A reading of each of these GPUs that NVML answers for (one that fails is left out; power and temperature
        are None where the GPU does not report them)."""
        nvml = self._open()
        if nvml is None:
            return ()
        found = []
        for index in indices:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                raw = {
                    "index": index,
                    "util_percent": nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_used_gb": nvml.nvmlDeviceGetMemoryInfo(handle).used / GIB,
                }
            except nvml.NVMLError as exc:
                log.warning("reading GPU %d failed: %r", index, exc)
                continue
            raw["power_w"] = _optional(nvml, lambda h: nvml.nvmlDeviceGetPowerUsage(h) / 1000, handle)  # mW
            raw["temp_c"] = _optional(
                nvml, lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU), handle
            )
            found.append({k: round(v, 3) if isinstance(v, float) else v for k, v in raw.items()})
        return readings(found)

    def process_memory_gb(self, indices: Sequence[int], pids: set[int]) -> float | None:
        """GPU memory these processes hold on these GPUs (GiB), where NVML reports it per process; None where it
        reports no figure for any of them."""
        nvml = self._open()
        if nvml is None or not pids:
            return None
        used = []
        for index in indices:
            try:
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError as exc:
                log.debug("no per-process GPU memory of GPU %d: %r", index, exc)
                continue
            used += [p.usedGpuMemory for p in processes if p.pid in pids and isinstance(p.usedGpuMemory, int)]
        return round(sum(used) / GIB, 3) if used else None

    def _open(self) -> Any:
        if self._nvml is None and not self._broken:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as exc:  # ImportError, NVMLError: the node does not read its GPUs
                log.info("no GPU readings (hang detection, telemetry): %r", exc)
                self._broken = True
        return self._nvml


def _optional(nvml: Any, read: Callable[[Any], Any], handle: Any) -> float | None:
    """A figure some GPUs do not report (NVML_ERROR_NOT_SUPPORTED): None then."""
    try:
        return float(read(handle))
    except (nvml.NVMLError, TypeError, ValueError):
        return None
