"""On a machine with an NVIDIA GPU (skipped elsewhere, never faked): the agent's NVML reader gives the figures
`nvidia-smi` shows for the same GPU, so the telemetry a heartbeat carries is NVML's own."""

import shutil
import subprocess

import pytest

from services.agent.nvml import GpuProbe

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install '.[gpu]')")


@pytest.fixture(scope="module")
def gpu_count() -> int:
    try:
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA driver: {exc!r}")


def smi(index: int) -> dict[str, float | None]:
    """nvidia-smi's own view of one GPU: memory used (GiB), temperature, power (W; None: not supported)."""
    out = subprocess.run(
        [
            "nvidia-smi",
            f"--id={index}",
            "--query-gpu=memory.used,temperature.gpu,power.draw",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    memory, temp, power = (x.strip() for x in out.split(","))
    return {
        "memory_used_gb": float(memory) / 1024,
        "temp_c": float(temp),
        "power_w": float(power) if power.replace(".", "", 1).isdigit() else None,
    }


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi is not installed")
def test_each_reading_is_what_nvidia_smi_shows(gpu_count):
    if not gpu_count:
        pytest.skip("the driver sees no GPU")
    readings = GpuProbe().read(list(range(gpu_count)))
    assert [g.index for g in readings] == list(range(gpu_count))
    for reading in readings:
        seen = smi(reading.index)
        assert 0 <= reading.util_percent <= 100
        assert reading.memory_used_gb == pytest.approx(seen["memory_used_gb"], abs=0.25)  # an idle GPU: steady
        assert reading.temp_c == pytest.approx(seen["temp_c"], abs=3)
        assert (reading.power_w is None) == (seen["power_w"] is None)
