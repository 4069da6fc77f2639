"""Real MLPerf logs replayed as jobs for the ETA tests, and the follower that records every ETA on the way.

A replay takes a minute of real time. The replays the tests need are started side by side the first time one is
asked for (`Replays`, the session's `mlperf_replays` fixture), so the tier waits one minute for them, not two."""

import asyncio
import sys
import tarfile
import time
from pathlib import Path
from shlex import quote

import httpx

from tests.conftest import eventually
from tests.e2e.helpers import get, submit

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
    """The history model is trained in the background from the corpus at the stack's first start."""

    async def history_model():
        health = (await api.get("/healthz")).json()["services"]["estimator"]
        return health.get("details", {}).get("history_model", {}).get("version")

    await eventually(history_model, timeout_s=600, interval_s=2)


async def follow_eta(api: httpx.AsyncClient, project: str, job_id: str) -> tuple[dict, Seen]:
    """The job once it ended, and every ETA seen on the way."""
    seen: Seen = []
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


class Replays:
    """The ETA tests' replays (`seen`: the gnn log as recorded; `unseen`: renamed, with its declared target),
    started together once the history model is there, each in a project and a folder of its own."""

    def __init__(self, api: httpx.AsyncClient, exchange: Path) -> None:
        self.api, self.exchange = api, exchange
        self.tasks: dict[str, asyncio.Task] = {}

    async def result(self, name: str) -> tuple[dict, Seen]:
        if not self.tasks:
            await wait_for_history_model(self.api)
            self.tasks = {
                "seen": asyncio.create_task(self._replay("seen", corpus_log())),
                "unseen": asyncio.create_task(self._replay("unseen", unseen_log(), metrics=[UNSEEN_METRIC])),
            }
        return await asyncio.shield(self.tasks[name])

    async def _replay(self, name: str, log: str, **body) -> tuple[dict, Seen]:
        return await replay(
            self.api, f"p-eta-replay-{name}", self.exchange / f"eta-replay-{name}", log, speed=1, **body
        )

    def cancel(self) -> None:
        for task in self.tasks.values():
            task.cancel()
