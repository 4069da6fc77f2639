"""The agent measures its GPUs at start: a separate process under a hard timeout, its answer parsed as hostile."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from shared.nodes import Gpu
from services.agent import gpubench, resources
from services.agent.resources import describe_node
from services.agent.throughput import BENCH, bench_env, measure_tflops, parse, run_process, with_measured

H100 = Gpu(index=0, model="NVIDIA H100 80GB HBM3", memory_gb=79.6, tflops=989.0)


def answer(*rows, **extra) -> str:
    return json.dumps({"gpus": list(rows), **extra}) + "\n"


def test_the_benchmarks_answer_gives_each_gpus_figure_by_index():
    output = "loading torch\n" + answer({"index": 0, "tflops": 712.5, "dtype": "bfloat16"}, {"index": 1, "tflops": 640})
    assert parse(output) == {0: 712.5, 1: 640.0}


@pytest.mark.parametrize(
    "row",
    [
        {"index": 0, "tflops": float("nan")},
        {"index": 0, "tflops": float("inf")},
        {"index": 0, "tflops": -5},
        {"index": 0, "tflops": 0},
        {"index": 0, "tflops": 1e9},
        {"index": 0, "tflops": "712"},
        {"index": -1, "tflops": 7},
        {"index": True, "tflops": 7},
        {"index": "0", "tflops": 7},
        {"index": 0, "tflops": True},
        {"index": 0, "error": "busy: 3.0 of 80.0 GiB free"},
        "0:712",
        None,
    ],
)
def test_a_figure_that_is_not_a_finite_positive_number_for_an_index_is_dropped(row):
    assert parse(answer(row)) == {}


@pytest.mark.parametrize(
    "output",
    [
        "",
        "garbage",
        "[1, 2]",
        '{"gpus": 5}',
        '{"gpus": [], "error": "no CUDA"}',
        answer({"index": 0, "tflops": 7}) + "trailing garbage",
    ],
)
def test_an_answer_that_is_not_the_expected_shape_gives_no_figures(output):
    assert parse(output) == {}


def test_the_benchmark_runs_in_its_own_process_with_every_gpu_numbered_as_nvml_and_without_the_agents_settings():
    seen = {}

    def runner(command, timeout_s, env):
        seen.update(command=command, timeout_s=timeout_s, env=env)
        return answer({"index": 0, "tflops": 700.0})

    environ = {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "1", "TRAINMASTER_NATS_PASSWORD": "secret"}
    assert measure_tflops(python="/opt/torch/bin/python", timeout_s=42, runner=runner, environ=environ) == {0: 700.0}
    assert seen["command"] == ["/opt/torch/bin/python", str(BENCH)] and seen["timeout_s"] == 42
    assert seen["env"] == {"PATH": "/usr/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert bench_env({})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_benchmark_that_hangs_is_killed_at_the_timeout_and_the_table_stands():
    def hanging(command, timeout_s, env):  # a broken driver: the process never answers
        return run_process([sys.executable, "-c", "import time; time.sleep(600)"], timeout_s, env)

    assert measure_tflops(timeout_s=0.5, runner=hanging) == {}


@pytest.mark.parametrize("error", [subprocess.CalledProcessError(1, ["python"]), FileNotFoundError("python9")])
def test_a_benchmark_that_crashes_or_cannot_start_gives_no_figures(error):
    def failing(command, timeout_s, env):
        raise error

    assert measure_tflops(runner=failing) == {}


def test_the_benchmark_script_without_cuda_exits_cleanly_saying_so(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no CUDA device, also on a machine with a GPU
    done = subprocess.run([sys.executable, str(BENCH)], capture_output=True, timeout=120, text=True)
    assert done.returncode == 0
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["gpus"] == [] and result["error"].startswith("no CUDA")

    def without_cuda(command, timeout_s, env):  # the agent shows the script every GPU: none here
        return run_process(command, timeout_s, {**env, "CUDA_VISIBLE_DEVICES": ""})

    assert measure_tflops(runner=without_cuda) == {}  # the agent's own reading of that answer: nothing measured


def test_measured_figures_go_to_their_gpus_by_index():
    gpus = (H100, H100.model_copy(update={"index": 1}))
    assert [g.measured_tflops for g in with_measured(gpus, {1: 650.0, 7: 1.0})] == [None, 650.0]


def test_nvml_gpus_are_measured_and_configured_ones_are_not(monkeypatch):
    entry = {"id": "box", "kind": "local", "max_gpus": 1, "gpus": [{"model": "A100", "memory_gb": 40, "tflops": 312}]}
    calls = []

    def measure():
        calls.append(1)
        return {0: 701.0}

    monkeypatch.setattr(resources, "gpus_from_nvml", lambda: (H100,))
    node = describe_node(entry, use_nvml=True, virtual=True, measure=measure)
    assert node.resources_source == "nvml" and node.gpus[0].measured_tflops == 701.0 and node.gpus[0].tflops == 989
    assert describe_node(entry, use_nvml=True, virtual=True).gpus[0].measured_tflops is None  # skipped by setting
    monkeypatch.setattr(resources, "gpus_from_nvml", lambda: None)
    assert describe_node(entry, use_nvml=True, virtual=True, measure=measure).gpus[0].measured_tflops is None
    assert calls == [1]  # without NVML's GPUs nothing is measured


def test_measuring_leaves_no_torch_and_so_no_cuda_context_in_the_agents_process():
    probe = (
        "import sys; from services.agent.throughput import measure_tflops; measure_tflops(timeout_s=120); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_the_measurement_is_on_unless_the_setting_turns_it_off(monkeypatch):
    from services.agent.app import AgentSettings

    assert AgentSettings(node_id="box").measure_gpus
    monkeypatch.setenv("TRAINMASTER_MEASURE_GPUS", "false")
    assert not AgentSettings(node_id="box").measure_gpus


class FakeTorch:
    """The part of torch the benchmark uses, on the CPU: CUDA's memory figures made up, some types refused."""

    def __init__(self, *, free: float = 1.0, refused: tuple = ()) -> None:
        import torch

        self.torch, self.refused = torch, refused
        self.bfloat16, self.float16, self.float32 = torch.bfloat16, torch.float16, torch.float32
        self.cuda = SimpleNamespace(
            mem_get_info=lambda device: (free * 80 * 2**30, 80 * 2**30),
            synchronize=lambda device=None: None,
            empty_cache=lambda: None,
        )

    def device(self, kind, index):
        return "cpu"

    def randn(self, *shape, device, dtype):
        if dtype in self.refused:
            raise RuntimeError(f"no kernel for {dtype}")
        return self.torch.randn(*shape, dtype=dtype)

    def matmul(self, a, b):
        return a @ b


def test_the_benchmark_times_bf16_matmuls_and_falls_back_to_another_type_where_bf16_has_none():
    row = gpubench.measure(FakeTorch(), 0, n=64, seconds=0.01)
    assert row["dtype"] == "bfloat16" and row["n"] == 64 and row["tflops"] >= 0
    row = gpubench.measure(FakeTorch(refused=(FakeTorch().bfloat16,)), 1, n=64, seconds=0.01)
    assert row["index"] == 1 and row["dtype"] == "float16"
    every = FakeTorch()
    row = gpubench.measure(FakeTorch(refused=(every.bfloat16, every.float16, every.float32)), 0, n=64, seconds=0.01)
    assert row["error"].startswith("RuntimeError: no kernel") and "tflops" not in row


def test_the_benchmark_leaves_a_gpu_in_use_alone():
    row = gpubench.measure(FakeTorch(free=0.5), 0, n=64, seconds=0.01)
    assert row == {"index": 0, "error": "busy: 40.0 of 80.0 GiB free"}
