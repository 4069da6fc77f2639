"""The job lifecycle end to end: REST API → bus → services → agent → real processes, and back."""

import os
import secrets
import signal
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.e2e.helpers import get, logs, restart_agent, submit, wait_phase

pytestmark = pytest.mark.e2e

TRAIN = (
    'python3 -c "import time\n'
    "for step in range(1, 31):\n"
    "    print(f'step {step} loss {1.0 - step * 0.03:.3f}', flush=True)\n"
    '    time.sleep(0.15)\n"'
)
LOSS = {"name": "loss", "regex": r"loss (?P<value>[0-9.]+)", "mode": "min", "target": 0.1}


async def test_a_job_runs_to_completion_with_logs_usage_and_an_estimate(api, project, status_log):
    job = await submit(api, project, command=TRAIN, metrics=[LOSS])
    job_id = job["metadata"]["id"]
    assert job["status"]["phase"] == "Creating"

    async def estimated():
        current = await get(api, project, job_id)
        return current["status"]["eta"]

    eta = await eventually(estimated, timeout_s=30, interval_s=0.1)
    assert eta["method"] and eta["low_s"] <= eta["remaining_s"] <= eta["high_s"]
    done = await wait_phase(api, project, job_id, "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]
    assert done["status"]["task_statuses"][0]["exit_code"] == 0
    assert done["status"]["duration"] > 0 and done["status"]["node_id"]
    phases = [p for p, _ in status_log.phases[job_id]]
    assert phases[0] == "Pending" and phases.index("Running") < phases.index("Completed")

    text = await eventually(lambda: _logs_with(api, project, job_id, "step 30 loss"))
    assert text.count("\n") == 30
    curves = (await api.get(f"/v2/{project}/training-jobs/{job_id}/metrics")).json()
    (loss,) = curves["series"]
    assert loss["name"] == "loss" and loss["target"] == 0.1 and len(loss["points"]) == 30
    assert loss["points"][-1][1] == 0.1

    async def charged():
        usage = (await api.get(f"/v2/{project}/usage")).json()
        return usage if usage["total"]["attempts"] == 1 else None

    usage = await eventually(charged)
    assert usage["total"]["seconds"] > 3 and usage["by_user"][0]["key"] == "admin"


async def _logs_with(api, project, job_id, needle):
    text = await logs(api, project, job_id)
    return text if needle in text else None


async def test_exit_code_3_fails_the_job_with_the_code(api, project):
    job = await submit(api, project, command="echo about to fail >&2; exit 3")
    done = await wait_phase(api, project, job["metadata"]["id"], "Failed", "Completed")
    assert done["status"]["phase"] == "Failed"
    task = done["status"]["task_statuses"][0]
    assert task["exit_code"] == 3 and "exited with code 3" in task["message"] and "about to fail" in task["message"]


def process_group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def host_pids(*argv: str) -> list[int]:
    """Host pids of the processes running exactly `argv` (a task's own `$$` is a pid in its PID namespace)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]:
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return pids


async def test_terminate_ends_the_whole_process_group(api, project):
    seconds = f"300.{secrets.randbelow(10**6):06d}"  # this test's own sleeps, told apart on the host
    job = await submit(api, project, command=f"sleep {seconds} & sleep {seconds}; wait")
    job_id = job["metadata"]["id"]
    await wait_phase(api, project, job_id, "Running")
    pids = await eventually(lambda: _two(host_pids("sleep", seconds)))
    pgid = os.getpgid(pids[0])
    assert os.getpgid(pids[1]) == pgid and process_group_alive(pgid)

    response = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    assert response.status_code == 202
    assert response.json()["status"]["phase"] in ("Terminating", "Terminated")
    done = await wait_phase(api, project, job_id, "Terminated", timeout_s=30)
    assert "terminated by admin" in done["status"]["reason"]
    assert not process_group_alive(pgid)

    again = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    assert again.status_code == 409 and again.json()["error_code"] == "406027"


async def _two(pids: list[int]) -> list[int] | None:
    return pids if len(pids) == 2 else None


async def test_a_queued_job_can_be_terminated_before_it_runs(api, project):
    # only local-1 has 2 GPUs: while the first job holds them the second waits (a job no node could ever hold is
    # refused at submission, so waiting needs a busy node)
    blocker = await submit(api, project, command="sleep 60", gpu_count=2)
    await wait_phase(api, project, blocker["metadata"]["id"], "Running")
    job = await submit(api, project, command="true", gpu_count=2)
    job_id = job["metadata"]["id"]
    await wait_phase(api, project, job_id, "Pending")
    response = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    assert response.status_code == 202 and response.json()["status"]["phase"] == "Terminated"
    await api.post(
        f"/v2/{project}/training-jobs/{blocker['metadata']['id']}/actions", json={"action_type": "terminate"}
    )
    await wait_phase(api, project, blocker["metadata"]["id"], "Terminated", "Failed")


async def test_delete_only_finished_jobs(api, project):
    job = await submit(api, project, command="sleep 30")
    job_id = job["metadata"]["id"]
    refused = await api.delete(f"/v2/{project}/training-jobs/{job_id}")
    assert refused.status_code == 409 and refused.json()["error_code"] == "406014"
    await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "terminate"})
    await wait_phase(api, project, job_id, "Terminated")
    assert (await api.delete(f"/v2/{project}/training-jobs/{job_id}")).status_code == 204
    assert (await api.get(f"/v2/{project}/training-jobs/{job_id}")).status_code == 404
    # the name is free again
    await submit(api, project, name=job["metadata"]["name"], command="true")


async def test_list_pages_and_filters_by_phase(api, project):
    ids = [(await submit(api, project, command="true"))["metadata"]["id"] for _ in range(3)]
    for job_id in ids:
        await wait_phase(api, project, job_id, "Completed")
    page = (await api.get(f"/v2/{project}/training-jobs", params={"limit": 2})).json()
    assert page["total"] == 3 and page["count"] == 2 and page["items"][0]["metadata"]["id"] == ids[-1]
    rest = (await api.get(f"/v2/{project}/training-jobs", params={"limit": 2, "offset": 2})).json()
    assert [j["metadata"]["id"] for j in rest["items"]] == [ids[0]]
    none = (await api.get(f"/v2/{project}/training-jobs", params={"phase": "Running"})).json()
    assert none["total"] == 0


async def test_logs_follow_streams_until_the_job_ends(api, project):
    job = await submit(api, project, command="for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done")
    job_id = job["metadata"]["id"]
    lines = []
    async with api.stream("GET", f"/v2/{project}/training-jobs/{job_id}/logs", params={"follow": "true"}) as r:
        async for line in r.aiter_lines():
            lines.append(line)
    assert lines == [f"line {i}" for i in range(1, 6)]
    assert (await get(api, project, job_id))["status"]["phase"] == "Completed"


async def test_the_task_environment(api, project):
    job = await submit(
        api,
        project,
        command="env | sort",
        gpu_count=1,
        min_gpu_memory_gb=30,
        allowed="cloud",
        parameters=[{"name": "lr", "value": "0.01"}],
        environments={"MY_VAR": "x"},
    )
    job_id = job["metadata"]["id"]
    done = await wait_phase(api, project, job_id, "Completed", "Failed")
    text = await eventually(lambda: _logs_with(api, project, job_id, "TRAINMASTER_JOB_ID"))
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert env["TRAINMASTER_JOB_ID"] == job_id and env["lr"] == "0.01" and env["MY_VAR"] == "x"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["TRAINMASTER_ATTEMPT"] == "1"
    assert float(env["TRAINMASTER_GPU_MEMORY_GB"]) >= 30 and env["TRAINMASTER_GPU_MODEL"].startswith("A100")
    assert done["status"]["node_id"] in ("reserved-1", "ondemand-1")
    assert "MONGO_URL" not in env and "TRAINMASTER_NATS_URL" not in env


async def test_agent_killed_the_job_goes_abnormal_lost_and_is_requeued(api, project, stack, status_log, shared_dir):
    marker = shared_dir / "runs"
    marker.touch()
    marker.chmod(0o666)  # appended to by each attempt, each its own user
    # the first run lasts past the kill; the second need not wait
    run = f'echo $TRAINMASTER_NODE_ID >> {marker}; [ "$TRAINMASTER_ATTEMPT" != 1 ] || sleep 4'
    job = await submit(api, project, command=run, allowed="local")
    job_id = job["metadata"]["id"]
    running = await wait_phase(api, project, job_id, "Running")
    node_id = running["status"]["node_id"]
    await eventually(lambda: _exists(marker))  # Running is reported when the task is spawned, before its command ran
    stack.signal(f"agent-{node_id}", signal.SIGKILL)
    try:
        await eventually(lambda: _seen(status_log, job_id, ("Abnormal", "Lost")), timeout_s=20)
        await wait_phase(api, project, job_id, "Pending", "Running", "Completed")  # requeued right after
    finally:
        restart_agent(stack, node_id)
    done = await wait_phase(api, project, job_id, "Completed", timeout_s=60)
    assert done["status"]["attempt"] == 2
    runs = marker.read_text().split()
    assert len(runs) == 2 and runs[0] == node_id  # the first run died with its agent, then it ran again
    attempts = done["status"]["attempts"]
    assert [(a["reason"], a["outcome"]) for a in attempts] == [("started", "node_lost"), ("node_lost", "completed")]


async def _seen(log, job_id, status):
    return status in log.phases[job_id]


async def test_a_job_running_past_max_duration_is_terminated(api, project):
    job = await submit(api, project, command="sleep 120", max_duration_s=2)
    done = await wait_phase(api, project, job["metadata"]["id"], "Terminated", "Completed", "Failed", timeout_s=30)
    assert done["status"]["phase"] == "Terminated"
    assert "max_duration_s (2s)" in done["status"]["reason"]
    assert 2000 <= done["status"]["duration"] < 15000


async def _exists(path: Path):
    return path.exists() and path.read_text().strip()
