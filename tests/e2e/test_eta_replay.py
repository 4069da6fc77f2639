"""A real MLPerf log replayed through a job in real time: the job's ETA converges toward the true remaining time.

The log was recorded on 64 nodes of 8 H100s and is replayed on a one-GPU test node, which is all the history
model is told: its prior is hours. The live progress and metric curve must pull the estimate to the minute the
run really takes (the accuracy of the prior on the right hardware is measured by `make bench-eta`)."""
import asyncio
import sys
import tarfile
import time
from pathlib import Path
from shlex import quote

import pytest

from tests.conftest import eventually
from tests.e2e.helpers import get, submit

pytestmark = pytest.mark.e2e
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "mlperf" / "mlperf-training-v4.0.tar.gz"
RUN = "NVIDIA/results/eos_n64_ngc24.04_dgl/gnn/result_0.txt"  # 64 s on 64 nodes of 8 H100s
TRUE_S = 64.4
SPEED = 1
REPLAY = r'''
import json, sys, time
lines = open(sys.argv[1]).read().splitlines()
speed = float(sys.argv[2])
start_ms = next(json.loads(l.split(":::MLLOG ", 1)[1])["time_ms"] for l in lines if '"run_start"' in l)
began = time.time()
for line in lines:
    if ":::MLLOG " in line:
        at = (json.loads(line.split(":::MLLOG ", 1)[1])["time_ms"] - start_ms) / 1000 / speed
        time.sleep(max(0.0, began + at - time.time()))
    print(line, flush=True)
'''


async def wait_for_history_model(api) -> None:
    """The history model is trained in the background from the corpus at the stack's first start."""
    async def history_model():
        health = (await api.get("/healthz")).json()["services"]["estimator"]
        return health.get("details", {}).get("history_model", {}).get("version")

    await eventually(history_model, timeout_s=600, interval_s=2)


async def follow_eta(api, project: str, job_id: str) -> tuple[dict, list[tuple[float, float, float, float]]]:
    """The job once it ended, and every ETA seen on the way: (wall time, remaining, low, high)."""
    seen: list[tuple[float, float, float, float]] = []
    while True:
        current = await get(api, project, job_id)
        if current["status"]["phase"] in ("Completed", "Failed"):
            return current, seen
        eta = current["status"]["eta"]
        if eta:
            seen.append((time.time(), eta["remaining_s"], eta["low_s"], eta["high_s"]))
        await asyncio.sleep(0.5)


@pytest.mark.skipif(not CORPUS.exists(), reason="the MLPerf logs are not beside the project")
@pytest.mark.timeout(900)  # may first wait for the history model the stack trains at its first start
async def test_a_replayed_mlperf_run_sees_its_eta_converge(api, project, shared_dir):
    await wait_for_history_model(api)
    with tarfile.open(CORPUS) as tar:
        log = tar.extractfile(RUN).read().decode()
    (shared_dir / "run.log").write_text(log)  # where the job, a user of its own, can read it
    job = await submit(api, project, command=f"{sys.executable} -c {quote(REPLAY)} {shared_dir / 'run.log'} {SPEED}")
    current, seen = await follow_eta(api, project, job["metadata"]["id"])
    assert current["status"]["phase"] == "Completed"
    end = current["status"]["end_time"] / 1000
    start = current["status"]["start_time"] / 1000
    total = end - start
    assert 0.8 * TRUE_S / SPEED < total < TRUE_S / SPEED + 15
    errors = [(t - start, abs(remaining - (end - t))) for t, remaining, _, _ in seen]
    first = sorted(e for at, e in errors if at < 0.15 * total)
    second_half = sorted(e for at, e in errors if at > 0.5 * total)
    assert first and second_half, errors
    median_late = second_half[len(second_half) // 2]
    assert median_late < 0.25 * total, errors  # within a quarter of the run's length once half of it is seen
    assert median_late < first[len(first) // 2], errors  # and closer than at the start: it converges
