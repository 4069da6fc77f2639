"""The node's GPUs measured at start: `gpubench.py` run in a process of its own under a hard timeout (a broken
driver never hangs the agent, and no CUDA context stays in it), its answer read as a claim like any other."""

import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from shared.nodes import Gpu

log = logging.getLogger(__name__)

BENCH = Path(__file__).with_name("gpubench.py")
MAX_OUTPUT = 64 * 1024  # the answer is one short line; more is not read
MAX_TFLOPS = 1e5  # no GPU is near this: past it a figure is garbage, not a measurement

# (command, timeout_s, env) -> stdout; raises subprocess.TimeoutExpired, OSError or CalledProcessError
Runner = Callable[[list[str], float, dict[str, str]], str]


def run_process(command: list[str], timeout_s: float, env: dict[str, str]) -> str:
    """The command's standard output; killed past `timeout_s`."""
    done = subprocess.run(
        command, capture_output=True, timeout=timeout_s, env=env, check=True, stdin=subprocess.DEVNULL
    )
    return done.stdout.decode(errors="replace")


def bench_env(environ: dict[str, str]) -> dict[str, str]:
    """The agent's environment for the benchmark less its own settings (credentials among them): every GPU
    visible, numbered as NVML numbers them."""
    env = {k: v for k, v in environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("TRAINMASTER_")}
    return {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def parse(output: str) -> dict[int, float]:
    """Measured TFLOPS by GPU index from the benchmark's last line; figures that are not finite and positive,
    and anything that is not the expected shape, are dropped."""
    lines = output[-MAX_OUTPUT:].strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    if not isinstance(answer, dict):
        return {}
    if answer.get("error"):
        log.info("GPU throughput not measured: %s", str(answer["error"])[:200])
    found: dict[int, float] = {}
    for row in answer.get("gpus", []) if isinstance(answer.get("gpus"), list) else []:
        if not isinstance(row, dict):
            continue
        index, tflops = row.get("index"), row.get("tflops")
        if row.get("error"):
            log.info("GPU %s not measured: %s", index, str(row["error"])[:200])
        if (
            isinstance(index, int)
            and not isinstance(index, bool)
            and index >= 0
            and isinstance(tflops, int | float)
            and not isinstance(tflops, bool)
            and math.isfinite(tflops)
            and 0 < tflops < MAX_TFLOPS
        ):
            found[index] = float(tflops)
    return found


def measure_tflops(
    *, python: str = "", timeout_s: float = 60.0, runner: Runner = run_process, environ: dict[str, str] | None = None
) -> dict[int, float]:
    """Each GPU's dense matmul TFLOPS by index, measured by `python` (empty: the agent's own); {} when it cannot
    be measured (no torch, no CUDA, a crash, past the timeout)."""
    command = [python or sys.executable, str(BENCH)]
    try:
        output = runner(command, timeout_s, bench_env(dict(os.environ if environ is None else environ)))
    except subprocess.TimeoutExpired:
        log.warning("GPU throughput not measured: the benchmark ran past %.0f s and was killed", timeout_s)
        return {}
    except (OSError, subprocess.CalledProcessError) as exc:
        log.warning("GPU throughput not measured: %s", exc)
        return {}
    return parse(output)


def with_measured(gpus: tuple[Gpu, ...], measured: dict[int, float]) -> tuple[Gpu, ...]:
    """The GPUs with the figure measured for their index (the others as they were)."""
    return tuple(
        g.model_copy(update={"measured_tflops": measured[g.index]}) if g.index in measured else g for g in gpus
    )
