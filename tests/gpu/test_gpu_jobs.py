"""Real CUDA jobs on the stack's one GPU node: what only a GPU walks (NVML's GPUs and their measured throughput, a
CUDA training and its estimate, CUDA's out-of-memory, a GPU's utilisation as a sign of life). Figures go to the
session's report (conftest `report`)."""

import json
import re
import time

import pytest
import pytest_asyncio

from tests.conftest import eventually
from tests.e2e.helpers import get, logs_containing, submit, wait_phase
from tests.gpu.conftest import NODE_ID, nvidia_gpus
from tests.gpu.scripts import ADAM, BUSY, DEVICES, IDLE, OOM, STANDARD, python

PROJECT = "gpu-tier"
TARGET = 0.01
LOSS = {"name": "loss", "regex": r"loss (?P<value>[0-9.e-]+)", "mode": "min", "target": TARGET}
HANG_TIMEOUT_S = 10


async def notices(api, job_id: str) -> list[dict]:
    items = (await api.get(f"/v2/{PROJECT}/notifications")).json()["items"]
    return [n for n in items if n["job_id"] == job_id]


async def test_the_node_registers_nvmls_gpus_with_their_measured_throughput(gpu_api, report):
    nodes = (await gpu_api.get("/v2/nodes")).json()["items"]
    node = next(n for n in nodes if n["node_id"] == NODE_ID)
    report["gpus"] = [
        {k: g.get(k) for k in ("index", "model", "memory_gb", "tflops", "measured_tflops")} for g in node["gpus"]
    ]
    assert node["resources_source"] == "nvml" and len(node["gpus"]) == nvidia_gpus()
    for gpu in node["gpus"]:
        assert gpu["measured_tflops"] and gpu["measured_tflops"] > 0, gpu
        if gpu["tflops"]:  # a measured figure far below the datasheet's is a sick GPU (or a wrong table)
            assert gpu["measured_tflops"] > 0.3 * gpu["tflops"], gpu


async def test_a_task_opens_its_own_gpus_device_files_and_not_the_others(gpu_api, report):
    """With `task_hide_other_gpus` (the tier's stack turns it on): a job given one GPU opens its device file and
    computes on it; a job given none is refused every GPU's file and CUDA finds no device."""
    seen = {}
    for gpus in (1, 0):
        job = await submit(gpu_api, PROJECT, command=python(DEVICES), gpu_count=gpus)
        done = await wait_phase(gpu_api, PROJECT, job["metadata"]["id"], "Completed", "Failed", timeout_s=120)
        text = await logs_containing(gpu_api, PROJECT, job["metadata"]["id"], "DEVICES ", timeout_s=20)
        found = re.search(r"^DEVICES (.*)$", text, re.MULTILINE)
        seen[gpus] = {
            "phase": done["status"]["phase"],
            **(json.loads(found.group(1)) if found else {"log": text[-3000:]}),
        }
    report["hidden_gpus"] = seen
    assert all("files" in s for s in seen.values()), seen  # each printed what it saw
    assert seen[1]["phase"] == "Completed" and seen[1]["cuda"] == 128.0, seen
    assert seen[1]["visible"].startswith("GPU-"), seen  # its GPU by UUID: the driver numbers what it can open
    # its own, and only it (on a machine of one GPU this holds either way: the job without GPUs below shows it)
    assert list(seen[1]["files"].values()).count("opened") == 1, seen
    assert seen[0]["phase"] == "Completed" and not seen[0]["cuda"], seen
    assert set(seen[0]["files"].values()) == {"PermissionError"}, seen


async def test_an_adam_training_completes_on_its_first_attempt_and_its_eta_band_holds_the_truth(gpu_api, report):
    job = await submit(gpu_api, PROJECT, command=python(ADAM, TARGET, 1.0), gpu_count=1, metrics=[LOSS])
    job_id = job["metadata"]["id"]
    samples: dict[str, tuple[float, dict]] = {}  # by the estimate's own time: each published estimate once

    async def finished():
        current = await get(gpu_api, PROJECT, job_id)
        if eta := current["status"].get("eta"):  # served as of this read (its band counts down with the clock)
            samples.setdefault(eta["updated_at"], (time.time(), eta))
        return current if current["status"]["phase"] in ("Completed", "Failed") else None

    done = await eventually(finished, timeout_s=280, interval_s=0.5)
    assert done["status"]["phase"] == "Completed", done["status"]
    attempts = done["status"]["attempts"]
    assert [(a["reason"], a["outcome"]) for a in attempts] == [("started", "completed")]  # default memory sufficed
    end = attempts[0]["end_time"] / 1000  # milliseconds since the epoch
    rows = [
        {
            "remaining_true_s": round(end - read_at, 1),
            "low_s": round(e["low_s"], 1),
            "remaining_s": round(e["remaining_s"], 1),
            "high_s": round(e["high_s"], 1),
            "method": e["method"],
        }
        for read_at, e in sorted(samples.values(), key=lambda sample: sample[0])
    ]
    hits = sum(r["low_s"] <= r["remaining_true_s"] <= r["high_s"] for r in rows)
    report["adam"] = {
        "job_id": job_id,
        "run_s": round(end - attempts[0]["start_time"] / 1000, 1),
        "samples": len(rows),
        "band_holds_truth": hits,
        "estimates": rows,
    }
    assert len(rows) >= 5, rows
    assert hits > len(rows) / 2, report["adam"]


async def test_an_everyday_pytorch_job_runs_in_the_tasks_own_user_namespaces_and_cgroup(gpu_api, report):
    """NCCL's process group from the agent's variables, DataLoader workers through the task's /dev/shm with pinned
    memory, DDP under torch.compile (Triton's kernels built in the task's caches), bf16 autocast, a checkpoint each
    epoch: with the job's defaults, on its first attempt."""
    job = await submit(gpu_api, PROJECT, command=python(STANDARD, 3), gpu_count=1)
    job_id = job["metadata"]["id"]
    try:
        done = await wait_phase(gpu_api, PROJECT, job_id, "Completed", "Failed", timeout_s=150)
    except AssertionError:  # still running: what it printed (its stacks each minute) says where it stands
        done = await get(gpu_api, PROJECT, job_id)
    ended = done["status"]["phase"] in ("Completed", "Failed")
    text = await logs_containing(gpu_api, PROJECT, job_id, "FACTS ", timeout_s=20 if ended else 1)
    facts = re.search(r"^FACTS (.*)$", text, re.MULTILINE)
    report["standard"] = {
        "status": {k: done["status"].get(k) for k in ("phase", "reason", "attempts")},
        "losses": re.findall(r"^epoch \d+ loss ([0-9.]+)$", text, re.MULTILINE),
        "facts": json.loads(facts.group(1)) if facts else None,
        "log_tail": None if facts and ended else text[-6000:],
    }
    if not ended:  # the GPU is the next test's
        await gpu_api.post(f"/v2/{PROJECT}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    assert done["status"]["phase"] == "Completed", report["standard"]
    assert [(a["reason"], a["outcome"]) for a in done["status"]["attempts"]] == [("started", "completed")]
    assert facts, report["standard"]
    assert report["standard"]["facts"]["all_reduce"] == 1.0 and report["standard"]["facts"]["epoch_saved"] == 3
    assert len(report["standard"]["losses"]) == 3


async def test_a_cuda_out_of_memory_is_recognised_and_fails_the_job_saying_so(gpu_api, report):
    job = await submit(gpu_api, PROJECT, command=python(OOM), gpu_count=1)
    done = await wait_phase(gpu_api, PROJECT, job["metadata"]["id"], "Failed", "Completed", timeout_s=180)
    report["oom"] = {"reason": done["status"]["reason"], "attempts": done["status"]["attempts"]}
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["reason"].startswith("out of GPU memory"), done["status"]["reason"]
    assert {a["outcome"] for a in done["status"]["attempts"]} == {"oom"}


async def test_an_idle_silent_job_holding_the_gpu_is_flagged_hanging(gpu_api, report):
    job = await submit(
        gpu_api, PROJECT, command=python(IDLE), gpu_count=1, hang_timeout_s=HANG_TIMEOUT_S, termination_grace_s=1
    )
    job_id = job["metadata"]["id"]
    try:
        await wait_phase(gpu_api, PROJECT, job_id, "Running", timeout_s=120)
        flagged = await eventually(lambda: notices(gpu_api, job_id), timeout_s=HANG_TIMEOUT_S + 60)
        report["idle"] = {"notices": flagged}
        assert flagged[0]["kind"] == "hung" and flagged[0]["message"].startswith("suspected hung"), flagged
    finally:
        await gpu_api.post(f"/v2/{PROJECT}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
        await wait_phase(gpu_api, PROJECT, job_id, "Terminated", "Failed", "Completed", timeout_s=60)


@pytest_asyncio.fixture(scope="module")
async def busy_job(gpu_api) -> dict:
    """A job busy on its GPU three hang timeouts long without printing, run to its end."""
    job = await submit(
        gpu_api, PROJECT, command=python(BUSY, 3 * HANG_TIMEOUT_S), gpu_count=1, hang_timeout_s=HANG_TIMEOUT_S
    )
    return await wait_phase(gpu_api, PROJECT, job["metadata"]["id"], "Completed", "Failed", timeout_s=300)


async def test_a_busy_silent_job_is_not_flagged(gpu_api, busy_job, report):
    job_id = busy_job["metadata"]["id"]
    report["busy"] = {"status": busy_job["status"]["phase"], "notices": await notices(gpu_api, job_id)}
    assert busy_job["status"]["phase"] == "Completed", busy_job["status"]
    assert [(a["reason"], a["outcome"]) for a in busy_job["status"]["attempts"]] == [("started", "completed")]
    assert await notices(gpu_api, job_id) == []


async def test_the_busy_jobs_gpu_utilisation_is_visible(gpu_api, busy_job, report):
    job_id = busy_job["metadata"]["id"]
    series = (await gpu_api.get(f"/v2/{PROJECT}/training-jobs/{job_id}/metrics")).json()["series"]
    util = next((s for s in series if s["name"] == "gpu_util"), None)
    if util is None:
        pytest.skip(
            "no gpu_util series in the job's metrics: GPU telemetry (branch `telemetry`) is not in this "
            "build, so utilisation is not checked"
        )
    values = [p[1] for p in util["points"]]
    report.setdefault("busy", {})["gpu_util"] = {"points": len(values), "max": max(values, default=None)}
    assert values and max(values) > 50, report["busy"]["gpu_util"]
