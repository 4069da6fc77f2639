"""A real MLPerf log replayed through a job at 5x speed: the job's ETA converges toward the true remaining time."""
import asyncio
import json
import sys
import tarfile
import time
from pathlib import Path
from shlex import quote

import pytest

from tests.e2e.helpers import get, submit, wait_phase

pytestmark = pytest.mark.e2e
CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "mlperf" / "mlperf-training-v4.0.tar.gz"
RUN = "Oracle/results/8xBM.GPU.H100.8/resnet/result_5.txt"  # 149 s on 8 H100s, to 75.9% top-1
SPEED = 5
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


@pytest.mark.skipif(not CORPUS.exists(), reason="the MLPerf logs are not beside the project")
async def test_a_replayed_mlperf_run_sees_its_eta_converge(api, project, tmp_path):
    with tarfile.open(CORPUS) as tar:
        log = tar.extractfile(RUN).read().decode()
    (tmp_path / "run.log").write_text(log)
    job = await submit(api, project, command=f"{sys.executable} -c {quote(REPLAY)} {tmp_path / 'run.log'} {SPEED}")
    job_id = job["metadata"]["id"]
    seen: list[tuple[float, float, float, float]] = []  # (wall time, remaining, low, high)
    while True:
        current = await get(api, project, job_id)
        if current["status"]["phase"] in ("Completed", "Failed"):
            break
        eta = current["status"]["eta"]
        if eta:
            seen.append((time.time(), eta["remaining_s"], eta["low_s"], eta["high_s"]))
        await asyncio.sleep(0.5)
    assert current["status"]["phase"] == "Completed"
    end = current["status"]["end_time"] / 1000
    start = current["status"]["start_time"] / 1000
    total = end - start
    assert 0.8 * 149 / SPEED < total < 149 / SPEED + 15
    errors = [(t - start, abs(remaining - (end - t))) for t, remaining, _, _ in seen]
    late = [e for at, e in errors if at > 0.6 * total]
    early = [e for at, e in errors if at < 0.4 * total]
    assert late and max(late) < 0.25 * total, errors
    assert not early or min(late) <= max(early), errors
