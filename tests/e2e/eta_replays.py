"""Real MLPerf logs replayed as jobs for the ETA tests, and the follower that records every ETA on the way.

A replay takes a minute of real time, mostly waiting: the two the tests need are watches (tests/e2e/watches.py),
started side by side with the tier's other watched jobs, beside a test that computes meanwhile."""

import asyncio
import sys
import tarfile
import time
from pathlib import Path
from shlex import quote

import httpx

from services.stack.processes import Stack
from tests.conftest import eventually, exchange
from tests.e2e.helpers import get, submit
from tests.e2e.watches import watch

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "data" / "mlperf" / "mlperf-training-v4.0.tar.gz"
RUN = "NVIDIA/results/eos_n64_ngc24.04_dgl/gnn/result_0.txt"  # 64 s on 64 nodes of 8 H100s
TRUE_S = 64.4  # its run_start to run_stop; eval_accuracy reaches 0.72 at 2.3 epochs
NEW_NAME = "heldout_model_x"  # no table, no training run and no task word knows it
UNSEEN_METRIC = {
    "name": "eval_accuracy",
    "regex": r'"key": "eval_accuracy", "value": (?P<value>[0-9.]+)',
    "mode": "max",
    "target": 0.72,
}
REPLAY = r"""
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
"""

Seen = list[tuple[float, float, float, float]]  # (wall time, remaining, low, high) of every ETA seen


async def wait_for_history_model(api: httpx.AsyncClient) -> None:
    """The stack serves the shipped history model (version 0) from its start; one trained at start instead, where
    that one could not be served, takes minutes."""

    async def history_model():
        health = (await api.get("/healthz")).json()["services"]["estimator"]
        return health.get("details", {}).get("history_model", {}).get("version") is not None

    await eventually(history_model, timeout_s=600, interval_s=2)


async def follow_eta(api: httpx.AsyncClient, project: str, job_id: str, *, timeout_s: float = 600) -> tuple[dict, Seen]:
    """The job once it ended, and every ETA seen on the way (the job still running after `timeout_s`: raises)."""
    seen: Seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = await get(api, project, job_id)
        if current["status"]["phase"] in ("Completed", "Failed"):
            return current, seen
        eta = current["status"]["eta"]
        if eta:
            seen.append((time.time(), eta["remaining_s"], eta["low_s"], eta["high_s"]))
        await asyncio.sleep(0.5)
    raise TimeoutError(f"job {job_id} had not ended after {timeout_s:.0f} s: {current['status']}")


def corpus_log(run: str = RUN) -> str:
    with tarfile.open(CORPUS) as tar:
        return tar.extractfile(run).read().decode()


def unseen_log() -> str:
    """The gnn log under a benchmark name no table and no training run knows."""
    log = corpus_log(RUN)
    renamed = log.replace(
        '"key": "submission_benchmark", "value": "gnn"', f'"key": "submission_benchmark", "value": "{NEW_NAME}"'
    )
    assert renamed != log and '"gnn"' not in renamed
    return renamed


async def replay(
    api: httpx.AsyncClient, project: str, folder: Path, log: str, *, speed: float, **body
) -> tuple[dict, Seen]:
    """Replay an MLPerf log as a job (its lines at `speed` x their pace) and follow its ETA to the end."""
    folder.mkdir(mode=0o777, exist_ok=True)
    folder.chmod(0o777)
    (folder / "run.log").write_text(log)  # where the job, a user of its own, can read it
    job = await submit(
        api, project, command=f"{sys.executable} -c {quote(REPLAY)} {folder / 'run.log'} {speed}", **body
    )
    return await follow_eta(api, project, job["metadata"]["id"])


@watch("mlperf-seen")
async def seen_replay(api: httpx.AsyncClient, stack: Stack) -> tuple[dict, Seen]:
    """The gnn log as recorded, once the history model is there."""
    await wait_for_history_model(api)
    return await _replay(api, stack, "seen", corpus_log())


@watch("mlperf-unseen")
async def unseen_replay(api: httpx.AsyncClient, stack: Stack) -> tuple[dict, Seen]:
    """The gnn log renamed, with its declared target, once the history model is there."""
    await wait_for_history_model(api)
    return await _replay(api, stack, "unseen", unseen_log(), metrics=[UNSEEN_METRIC])


async def _replay(api: httpx.AsyncClient, stack: Stack, name: str, log: str, **body) -> tuple[dict, Seen]:
    """A replay in a project and a folder of its own."""
    folder = exchange(stack.settings.data_dir) / f"eta-replay-{name}"
    return await replay(api, f"p-eta-replay-{name}", folder, log, speed=1, **body)
