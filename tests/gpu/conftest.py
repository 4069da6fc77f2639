"""The GPU tier: the whole stack on one node whose GPUs NVML finds, with real CUDA jobs. Every test here is
skipped, not faked, on a machine without an NVIDIA GPU that NVML and PyTorch's CUDA both see (`make test-gpu`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from tests.conftest import admin_client, start_stack

HERE = Path(__file__).resolve().parent
NODE_ID = "gpu-1"
CUDA_CHECK = "import json, torch; print(json.dumps([torch.cuda.is_available(), torch.cuda.device_count()]))"


def nvidia_gpus() -> int:
    """GPUs the driver lists (`nvidia-smi -L`, else NVML), 0 without a driver."""
    if smi := shutil.which("nvidia-smi"):
        try:
            done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            if done.returncode == 0:
                return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no package, no driver: no GPU
        return 0


def cuda_available() -> bool:
    """Whether PyTorch finds CUDA: asked in a child process, so the test process never holds a CUDA context."""
    try:
        done = subprocess.run([sys.executable, "-c", CUDA_CHECK], capture_output=True, text=True, timeout=120)
        available, count = json.loads(done.stdout.strip().splitlines()[-1])
        return bool(available and count)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return False


def why_skipped() -> str | None:
    """Why this machine cannot run the tier, None when it can."""
    if not nvidia_gpus():
        return "no NVIDIA GPU here (nvidia-smi and NVML find none): the GPU tier needs one"
    if not cuda_available():
        return "NVIDIA GPU present but PyTorch finds no CUDA in this Python (torch with CUDA is needed)"
    return None


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(item.path).resolve().parents]
    if not mine:
        return
    reason = why_skipped()
    if reason:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=reason))


def cluster(gpus: int) -> str:
    """One node that lists no GPU figures, only how many it may have: NVML's GPUs are accepted, at most that many
    (docs/security.md, "The cluster file"); its jobs run in the agent's own Python, which has torch."""
    return f"""
[[nodes]]
id = "{NODE_ID}"
kind = "local"
cpu_count = {min(os.cpu_count() or 4, 16)}
memory_gb = 64
price_per_hour = 1.0
max_gpus = {gpus}

[[engines]]
name = "pytorch"
environment = "agent"
default = true
"""


@pytest.fixture(scope="session")
def gpu_stack(tmp_path_factory, servers):
    try:
        import pynvml  # noqa: F401 (the agent reads its GPUs with it)
    except ImportError:
        pytest.fail("a GPU is here but nvidia-ml-py (pynvml) is not installed: the agent could not see it")
    # each task kept from the GPUs it was not given (services/agent/gpudevices.py): the tier's jobs run with it
    stack = start_stack(
        tmp_path_factory.mktemp("gpu-stack"),
        cluster=cluster(nvidia_gpus()),
        servers=servers,
        extra_env={"TRAINMASTER_TASK_HIDE_OTHER_GPUS": "true"},
    )
    yield stack
    stack.stop_all()


@pytest_asyncio.fixture(scope="session")
async def gpu_api(gpu_stack):
    async with admin_client(gpu_stack) as client:
        yield client


def out_dir() -> Path:
    out = Path(os.environ.get("OUT") or ".trainmaster")
    out.mkdir(parents=True, exist_ok=True)
    return out


class Report(dict):
    """The tier's figures, written to `$OUT/gpu-report.json` each time one is set: a tier stopped at its time
    limit (a GPU machine is lent by the minute) still leaves what it measured."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.write()

    def write(self) -> None:
        (out_dir() / "gpu-report.json").write_text(json.dumps(self, indent=2, default=str))


@pytest.fixture(scope="session")
def report():
    """Figures the tier measured, written to $OUT/gpu-report.json (or .trainmaster) as they are set."""
    figures = Report()
    yield figures
    figures.write()  # what a test changed inside an entry after setting it
    print(f"\nGPU tier figures ({out_dir() / 'gpu-report.json'}):\n{json.dumps(figures, indent=2, default=str)}")


def pytest_runtest_logreport(report):
    """A failure of the tier is printed, and kept in $OUT/gpu-failures.txt, when it happens, not at the session's
    end: a tier stopped at its time limit would otherwise show only its F's."""
    if report.failed and report.nodeid.startswith("tests/gpu/"):
        text = f"\n==== FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n"
        print(text, flush=True)
        with (out_dir() / "gpu-failures.txt").open("a") as failures:
            failures.write(text)
