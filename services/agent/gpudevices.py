"""Each GPU's device file, so a task can be kept from the GPUs it was not given.

`CUDA_VISIBLE_DEVICES` tells a task which GPUs are its; it does not stop one that opens another GPU's device file
(`/dev/nvidia<minor>`) itself. Where the setting `task_hide_other_gpus` is on, the shim binds an unreadable file over
every other GPU's device file in the task's own mount namespace (`shim.hide_devices`): opening one fails (EACCES),
as NVIDIA's own per-device file permissions make it (NVreg_DeviceFileMode); the control files (`/dev/nvidiactl`,
`/dev/nvidia-uvm`) stay. A GPU's file is found by its minor number (NVML's `nvmlDeviceGetMinorNumber`), not its
index: the two need not agree. With the others hidden, a task's `CUDA_VISIBLE_DEVICES` names its GPUs by their UUIDs
(`visible`), not their indices: the driver may number only the GPUs a process can open, and an index of the node's
would then name none of them, or another."""

import logging
import os
from collections.abc import Iterable
from typing import NamedTuple

log = logging.getLogger(__name__)


class GpuFile(NamedTuple):
    path: str  # its device file, /dev/nvidia<minor>
    uuid: str  # NVML's, as CUDA_VISIBLE_DEVICES takes it (GPU-...)


def device_files() -> dict[int, GpuFile]:
    """Each GPU's device file and UUID by its index (NVML's, the order `CUDA_VISIBLE_DEVICES` counts in with
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`); empty, said, without a driver, the nvidia-ml-py package or such files: then
    nothing is hidden."""
    try:
        import pynvml
    except ImportError:
        log.warning("task_hide_other_gpus: no nvidia-ml-py package here: tasks are not kept from other GPUs")
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.warning("task_hide_other_gpus: NVML did not start (%s): tasks are not kept from other GPUs", exc)
        return {}
    try:
        found = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            path = f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(handle)}"
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if not os.path.exists(path):
                log.warning("task_hide_other_gpus: GPU %d has no device file %s yet: it is not hidden", index, path)
                continue
            found[index] = GpuFile(path, uuid)
        if found:
            log.info("each task is kept from the device files of the GPUs it was not given: %s", found)
        return found
    except pynvml.NVMLError as exc:  # a GPU that cannot say its minor number or UUID: none is hidden (said)
        log.warning(
            "task_hide_other_gpus: NVML could not name the GPUs' files (%s): tasks are not kept from other GPUs", exc
        )
        return {}
    finally:
        pynvml.nvmlShutdown()


def others(files: dict[int, GpuFile], given: Iterable[int]) -> list[str]:
    """The device files of the GPUs a task was not given (all of them for a task without GPUs)."""
    mine = set(given)
    return sorted(f.path for index, f in files.items() if index not in mine)


def visible(files: dict[int, GpuFile], given: Iterable[int]) -> str | None:
    """A task's `CUDA_VISIBLE_DEVICES` where the other GPUs are hidden: its GPUs by UUID; None where a GPU given
    has none known (its index is kept, as without hiding)."""
    uuids = [files[i].uuid if i in files else None for i in given]
    return ",".join(u for u in uuids if u) if uuids and all(uuids) else None
