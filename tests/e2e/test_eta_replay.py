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


def corpus_log(run: str = RUN) -> str:
    with tarfile.open(CORPUS) as tar:
        return tar.extractfile(run).read().decode()


async def replay(api, project: str, shared_dir, log: str, *, speed: float, **body) -> tuple[dict, list]:
    """Replay an MLPerf log as a job (its lines at `speed` x their pace) and follow its ETA to the end."""
    (shared_dir / "run.log").write_text(log)  # where the job, a user of its own, can read it
    job = await submit(api, project, command=f"{sys.executable} -c {quote(REPLAY)} {shared_dir / 'run.log'} {speed}",
                       **body)
    return await follow_eta(api, project, job["metadata"]["id"])


@pytest.mark.skipif(not CORPUS.exists(), reason="the MLPerf logs are not beside the project")
@pytest.mark.timeout(900)  # may first wait for the history model the stack trains at its first start
async def test_a_replayed_mlperf_run_sees_its_eta_converge(api, project, shared_dir):
    await wait_for_history_model(api)
    current, seen = await replay(api, project, shared_dir, corpus_log(), speed=SPEED)
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


# A researcher's own job (issue 20): a small real training (a numpy MLP on scikit-learn's bundled digits, read
# without importing scikit-learn or torch, whose imports take tens of seconds on a busy machine) printing
# `step N loss X`, its target declared, no history, no amount of work; it stops when its smoothed loss meets the
# target (~850 steps: 20-30 s here). The estimate comes from its own curve with the band learned on the recorded
# sweep (`trainmaster-eta-eval --corpus own-jobs` measures it over held-out runs).
OWN_TRAINING = r'''
import gzip, importlib.util, os, sys, time
import numpy as np
target, pause = float(sys.argv[1]), float(sys.argv[2])
# scikit-learn's bundled digits, read without importing scikit-learn (its import is slow on a busy machine)
where = importlib.util.find_spec("sklearn").submodule_search_locations[0]
with gzip.open(os.path.join(where, "datasets", "data", "digits.csv.gz")) as f:
    data = np.loadtxt(f, delimiter=",")
x, y = data[:, :-1] / 16.0, data[:, -1].astype(int)
rng = np.random.default_rng(0)
w1, b1 = rng.normal(0, 64 ** -0.5, (64, 32)), np.zeros(32)
w2, b2 = rng.normal(0, 32 ** -0.5, (32, 10)), np.zeros(10)
params = [w1, b1, w2, b2]
velocity = [np.zeros_like(p) for p in params]
recent = []
for step in range(1, 2501):
    idx = rng.integers(0, len(x), 32)
    h = np.maximum(x[idx] @ w1 + b1, 0)
    logits = h @ w2 + b2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(32), y[idx]]).mean()
    g = p
    g[np.arange(32), y[idx]] -= 1
    g /= 32
    gh = (g @ w2.T) * (h > 0)
    grads = [x[idx].T @ gh, gh.sum(0), h.T @ g, g.sum(0)]
    for v, param, grad in zip(velocity, params, grads):
        v *= 0.9
        v -= 0.01 * grad
        param += v
    recent = (recent + [loss])[-50:]
    time.sleep(pause)
    if step % 10 == 0:
        print(f"step {step} loss {sum(recent) / len(recent):.4f}", flush=True)
        if sum(recent) / len(recent) <= target:
            break
'''
OWN_TARGET = 0.12
OWN_METRIC = {"name": "loss", "regex": r"step (?P<step>\d+) loss (?P<value>[0-9.]+)", "mode": "min",
              "target": OWN_TARGET}
OWN_CUTS = (0.1, 0.2, 0.3, 0.5, 0.8)


@pytest.mark.timeout(120)
async def test_a_researchers_own_training_gets_an_honest_interval(api, project):
    job = await submit(api, project, metrics=[OWN_METRIC],
                       command=f"{sys.executable} -c {quote(OWN_TRAINING)} {OWN_TARGET} 0.025")
    current, seen = await follow_eta(api, project, job["metadata"]["id"])
    assert current["status"]["phase"] == "Completed"
    start, end = current["status"]["start_time"] / 1000, current["status"]["end_time"] / 1000
    total = end - start
    assert seen and seen[0][0] - start < 0.25 * total, seen  # an estimate from the first lines on
    inside = {}
    for cut in OWN_CUTS:  # the latest estimate seen by each cut of the run, against the truth at that moment
        before = [s for s in seen if s[0] - start <= cut * total]
        if before:
            t, _, low, high = before[-1]
            inside[cut] = low - 1.0 <= end - t <= high + 1.0  # a second of slack: the poll, the exit
    # Measured on this very script replayed offline, and over held-out sweep runs (`--corpus own-jobs`): once half
    # the run is seen the band holds the truth; before that, on this curve, the learned band is too short (its
    # slow tail is rarer in the sweep than here), which the notes report rather than this test hiding.
    assert inside.get(0.5) and inside.get(0.8), (inside, total, seen)
    early = [s for s in seen if s[0] - start < 0.3 * total]
    assert max(high / max(low, 0.5) for _, _, low, high in early) >= 3, early  # early, it admits not knowing
