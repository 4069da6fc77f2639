"""A GPU's device file is found by its minor number (services/agent/gpudevices.py): a task is kept from the files of
the GPUs it was not given, never from its own."""

import sys
import types

from services.agent import gpudevices


class FakeNvml(types.ModuleType):
    """NVML of a host whose GPU indices and minor numbers disagree (index 0 is /dev/nvidia2, ...)."""

    class NVMLError(Exception):
        pass

    def __init__(self, minors: list[int]) -> None:
        super().__init__("pynvml")
        self.minors = minors

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.minors)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        return self.minors[handle]

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle:08d}-aaaa".encode()


def test_each_gpus_file_is_its_minor_numbers_and_a_task_is_kept_from_the_others(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([2, 0, 1]))
    monkeypatch.setattr(gpudevices.os.path, "exists", lambda path: path != "/dev/nvidia1")  # one file missing
    files = gpudevices.device_files()
    assert {i: f.path for i, f in files.items()} == {0: "/dev/nvidia2", 1: "/dev/nvidia0"}
    assert gpudevices.others(files, [0]) == ["/dev/nvidia0"]
    assert gpudevices.others(files, []) == ["/dev/nvidia0", "/dev/nvidia2"]  # a task without GPUs: every one
    assert gpudevices.others(files, [0, 1]) == []
    # its GPUs named by UUID (the driver may number only those it can open); by index where one has none known
    assert gpudevices.visible(files, [1, 0]) == "GPU-00000001-aaaa,GPU-00000000-aaaa"
    assert gpudevices.visible(files, [2]) is None and gpudevices.visible(files, []) is None


def test_without_a_driver_nothing_is_hidden_and_a_task_runs_as_before(monkeypatch):
    nvml = FakeNvml([0])

    def refused() -> None:
        raise nvml.NVMLError("no driver")

    nvml.nvmlInit = refused  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert gpudevices.device_files() == {}
