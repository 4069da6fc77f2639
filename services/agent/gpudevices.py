"""Each GPU's device file, so a task can be kept from the GPUs it was not given.

`CUDA_VISIBLE_DEVICES` tells a task which GPUs are its; it does not stop one that opens another GPU's device file
(`/dev/nvidia<minor>`) itself. Where the setting `task_hide_other_gpus` is on, the shim binds an unreadable file over
every other GPU's device file in the task's own mount namespace (`shim.hide_devices`): opening one fails (EACCES),
as NVIDIA's own per-device file permissions make it (NVreg_DeviceFileMode); the control files (`/dev/nvidiactl`,
`/dev/nvidia-uvm`) stay, and CUDA sees the task's own GPUs. A GPU's file is found by its minor number (NVML's
`nvmlDeviceGetMinorNumber`), not its index: the two need not agree."""

import logging
import os
from collections.abc import Iterable

log = logging.getLogger(__name__)


def device_files() -> dict[int, str]:
    """Each GPU's device file by its index (NVML's, the order `CUDA_VISIBLE_DEVICES` counts in with
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`); empty without a driver, the nvidia-ml-py package or such files."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        found = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            path = f"/dev/nvidia{pynvml.nvmlDeviceGetMinorNumber(pynvml.nvmlDeviceGetHandleByIndex(index))}"
            if os.path.exists(path):
                found[index] = path
        return found
    except pynvml.NVMLError as exc:  # a GPU that cannot say its minor number: none is hidden (said)
        log.warning("the GPUs' device files could not be read from NVML (%s): tasks are not kept from other GPUs", exc)
        return {}
    finally:
        pynvml.nvmlShutdown()


def others(files: dict[int, str], given: Iterable[int]) -> list[str]:
    """The device files of the GPUs a task was not given (all of them for a task without GPUs)."""
    mine = set(given)
    return sorted(path for index, path in files.items() if index not in mine)
