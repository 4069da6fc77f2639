"""A job that declares nothing and prints a tqdm-style bar (carriage returns, no newline until it ends) gets its
ETA from that bar through the whole stack: the agent ships the bar's frames as updates, the estimator reads them,
and the job's status says the progress, its unit, rate and source and the time to its end (issue 32)."""

import asyncio
import sys
import time
from shlex import quote

import pytest

from tests.e2e.helpers import get, submit
from tests.e2e.watches import watch

pytestmark = pytest.mark.e2e

# tqdm's own format, written by hand: the project's environment has no tqdm (the real library's output is read in
# tests/unit/estimator/test_progress_formats.py)
BAR_JOB = r"""
import sys, time
total, pause = int(sys.argv[1]), float(sys.argv[2])
began = time.time()
for i in range(total + 1):
    elapsed = time.time() - began
    rate = f"{i / elapsed:.2f}it/s" if elapsed > 0 else "?it/s"
    sys.stderr.write(f"\r{i * 100 // total:3d}%|{'#' * (i * 10 // total):10s}| {i}/{total} [{elapsed:04.1f}<?, {rate}]")
    sys.stderr.flush()
    if i < total:
        time.sleep(pause)
sys.stderr.write("\n")
print("done", flush=True)
"""
STEPS, PAUSE = 300, 0.1  # 30 s
CUTS = (0.3, 0.5, 0.8)


@watch("tqdm-bar")
async def bar_job(api, stack) -> tuple[dict, list]:
    """The job once it ended, and (wall time, eta) of every estimate on the way."""
    job = await submit(api, "p-eta-tqdm-bar", command=f"{sys.executable} -c {quote(BAR_JOB)} {STEPS} {PAUSE}")
    seen = []
    deadline = time.monotonic() + 170  # its test's own timeout is 180 s
    while time.monotonic() < deadline:
        current = await get(api, "p-eta-tqdm-bar", job["metadata"]["id"])
        if current["status"]["phase"] in ("Completed", "Failed"):
            return current, seen
        if eta := current["status"]["eta"]:
            seen.append((time.time(), eta))
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the tqdm-bar job had not ended after 170 s: {current['status']}")


@pytest.mark.timeout(180)
@pytest.mark.watched("tqdm-bar")
async def test_a_job_printing_a_tqdm_bar_gets_its_eta_from_it(watches):
    current, seen = await watches.result("tqdm-bar")
    assert current["status"]["phase"] == "Completed"
    start, end = current["status"]["start_time"] / 1000, current["status"]["end_time"] / 1000
    total = end - start
    assert seen, "no ETA while the bar moved"
    last = seen[-1][1]
    assert (last["source"], last["unit"], last["total"], last["until"], last["target"]) == (
        "tqdm",
        "it",
        STEPS,
        "end",
        None,
    )
    assert 0 < last["done"] <= STEPS and last["rate"] > 0
    for cut in CUTS:  # the latest estimate by each cut puts the end within a fifth of the run of the real one
        before = [(t, eta) for t, eta in seen if t - start <= cut * total]
        assert before, (cut, seen)
        t, eta = before[-1]
        assert abs(t + eta["remaining_s"] - end) < 0.2 * total, (cut, total, eta)
