"""Snapshot, re-place, recover: lost agents, out-of-memory, migration, distributed jobs."""

import json
import re
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.conftest import eventually
from tests.e2e.helpers import logs, logs_containing, restart_agent, submit, wait_phase
from tests.e2e.scripts import counter, ddp, gpu_hungry, hangs_once, quiet_but_progressing

pytestmark = pytest.mark.e2e
PYTHON = sys.executable


async def step_reached(api, project, job_id, step):
    text = await logs(api, project, job_id)
    steps = [int(s) for s in re.findall(r"^step (\d+)\b", text, re.M)]
    return max(steps) if steps and max(steps) >= step else None


async def test_a_killed_agent_costs_at_most_one_checkpoint_interval(api, project, stack):
    every, pause = 10, 0.1  # a checkpoint each second; the agent syncs every 0.5 s
    job = await submit(
        api,
        project,
        command=counter(total=60, every=every, pause=pause, resumed_pause=0.01),
        allowed="local",
        termination_grace_s=5,
    )
    job_id = job["metadata"]["id"]
    first = await wait_phase(api, project, job_id, "Running")
    reached = await eventually(lambda: step_reached(api, project, job_id, 25), timeout_s=30, interval_s=0.05)
    node_id = first["status"]["node_id"]
    stack.signal(f"agent-{node_id}", signal.SIGKILL)
    try:
        done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=60)
    finally:
        restart_agent(stack, node_id)
    assert done["status"]["phase"] == "Completed"
    second = done["status"]["attempts"][-1]
    assert second["node_ids"] != [node_id] and second["reason"] == "node_lost"
    text = await logs(api, project, job_id)
    resumed = int(re.search(r"attempt 2 on \S+ resumed from (\d+)", text).group(1))
    lost = reached - resumed
    assert 0 <= lost <= every + 0.5 / pause + 1, (reached, resumed)


async def test_out_of_gpu_memory_moves_to_a_bigger_gpu(api, project):
    # 50 GB: more than any owned or reserved GPU of the fleet (24, 24, 40 GB), so wherever a cost-sensitive job goes
    # first (a free reserved GPU is already paid for: it may go there before a local one), it runs out of memory
    # and ends on the 80-GB rental, each move to a node with more memory than the last.
    job = await submit(api, project, command=gpu_hungry(50), gpu_count=1, priority="cost")
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]["reason"]
    attempts = done["status"]["attempts"]
    outcomes = [a["outcome"] for a in attempts]
    assert outcomes[-1] == "completed" and len(outcomes) >= 2 and set(outcomes[:-1]) == {"oom"}, outcomes
    assert attempts[-1]["node_ids"] == ["ondemand-1"] and attempts[-1]["reason"] == "oom"
    assert all(a["node_ids"] != b["node_ids"] for a, b in zip(attempts, attempts[1:]))


class Webhook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        Webhook.received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


async def test_too_big_for_any_node_fails_with_the_reason_and_notifies(api, project):
    server = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        assert (await api.put(f"/v2/{project}/notifications", json={"webhook_url": url})).status_code == 200
        job = await submit(api, project, command=gpu_hungry(500), gpu_count=1)
        job_id = job["metadata"]["id"]
        done = await wait_phase(api, project, job_id, "Failed", "Completed", timeout_s=60)
        reason = done["status"]["reason"]
        assert "needs more than 80 GB per GPU" in reason and "largest node offers 80 GB per GPU" in reason
        attempts = done["status"]["attempts"]
        assert {a["outcome"] for a in attempts} == {"oom"} and attempts[-1]["node_ids"] == ["ondemand-1"]
        hooked = await eventually(lambda: _received(job_id), timeout_s=15)
        assert hooked["kind"] == "oom_unplaceable" and hooked["message"] == reason and len(Webhook.received) == 1
        listed = (await api.get(f"/v2/{project}/notifications")).json()
        assert listed["items"][0]["state"] == "delivered"
    finally:
        server.shutdown()


async def _received(job_id):
    return next((n for n in Webhook.received if n["job_id"] == job_id), None)


async def test_host_memory_is_enforced_and_the_job_gets_more(api, project):
    hog = f"{PYTHON} -c 'import time; b = bytearray(600 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1)'"
    job = await submit(api, project, command=hog, memory_gb=0.25)
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=60)
    assert done["status"]["phase"] == "Completed", done["status"]
    assert [a["outcome"] for a in done["status"]["attempts"]] == ["oom", "oom", "completed"]  # 0.25, 0.5, 1 GB


async def test_a_gpu_job_naming_no_host_memory_gets_its_gpus_share_not_one_gb(api, project):
    # CUDA's own libraries take more than 1 GB of host memory: 1.5 GB here, on nodes of at least 32 GB per GPU
    hog = f"{PYTHON} -c 'import time; b = bytearray(1536 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1)'"
    job = await submit(api, project, command=hog, gpu_count=1)
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=60)
    assert [a["outcome"] for a in done["status"]["attempts"]] == ["completed"], done["status"]


async def test_migrate_moves_a_running_job_and_it_continues_from_its_snapshot(api, project):
    job = await submit(
        api,
        project,
        command=counter(total=80, every=1000, pause=0.1, resumed_pause=0.01),
        allowed="local",
        termination_grace_s=10,
    )
    job_id = job["metadata"]["id"]
    first = await wait_phase(api, project, job_id, "Running")
    await eventually(lambda: step_reached(api, project, job_id, 15), timeout_s=30, interval_s=0.05)
    response = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "migrate"})
    assert response.status_code == 202, response.text
    done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=60)
    assert done["status"]["phase"] == "Completed"
    attempts = done["status"]["attempts"]
    assert [(a["reason"], a["outcome"]) for a in attempts] == [("started", "migrated"), ("migrated", "completed")]
    assert attempts[1]["node_ids"] != [first["status"]["node_id"]]
    text = await logs(api, project, job_id)
    saved = int(re.search(r"saved (\d+) on SIGTERM", text).group(1))
    assert f"resumed from {saved + 1}" in text  # no step lost, though it never checkpointed on its own
    refused = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "migrate"})
    assert refused.status_code == 409


async def test_a_two_rank_pytorch_ddp_job_runs_across_two_agents(api, project):
    job = await submit(api, project, command=ddp(PYTHON), node_count=2, allowed="local")
    job_id = job["metadata"]["id"]
    done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=90)
    assert done["status"]["phase"] == "Completed", done["status"]
    assert sorted(done["status"]["node_ids"]) == ["local-1", "local-2"]
    for rank in (0, 1):
        text = (await api.get(f"/v2/{project}/training-jobs/{job_id}/logs", params={"task": f"worker-{rank}"})).text
        assert f"rank {rank} of 2 sum 3.0" in text


async def test_the_pytorch_example_resumes_from_its_checkpoint_after_a_move(api, project):
    script = Path(__file__).resolve().parents[2] / "services/agent/sdk/trainmaster_examples/pytorch_train.py"
    job = await submit(
        api,
        project,
        command=f"{PYTHON} {script} --steps 1500 --checkpoint-every 200",
        allowed="local",
        metrics=[{"name": "loss", "regex": r"loss (?P<value>[0-9.e-]+)"}],
    )
    job_id = job["metadata"]["id"]
    await wait_phase(api, project, job_id, "Running")
    await eventually(lambda: step_reached(api, project, job_id, 300), timeout_s=60, interval_s=0.1)
    response = await api.post(f"/v2/{project}/training-jobs/{job_id}/actions", json={"action_type": "migrate"})
    assert response.status_code == 202, response.text
    done = await wait_phase(api, project, job_id, "Completed", "Failed", timeout_s=180)
    assert done["status"]["phase"] == "Completed", done["status"]
    text = await logs(api, project, job_id)
    saved = int(re.search(r"saved at step (\d+); exiting for the move", text).group(1))
    assert f"resumed from step {saved} (attempt 2)" in text and "step 1499 loss" in text


async def test_a_hung_job_is_restarted_from_its_checkpoint_and_a_quiet_progressing_one_is_left_alone(api, project):
    timeout_s = 3
    stuck = await submit(
        api, project, command=hangs_once(), allowed="local", hang_timeout_s=timeout_s, termination_grace_s=1
    )
    quiet = await submit(
        api, project, command=quiet_but_progressing(marks=28), allowed="local", hang_timeout_s=timeout_s
    )
    stuck_id, quiet_id = stuck["metadata"]["id"], quiet["metadata"]["id"]
    flagged = await eventually(lambda: _notices(api, project, stuck_id), timeout_s=timeout_s + 30, interval_s=0.2)
    assert [n["kind"] for n in flagged] == ["hung"]  # with the job in Running/Hanging, until its grace is over
    assert flagged[0]["message"].startswith("suspected hung: no output, metric point or progress mark for")
    done = await wait_phase(api, project, stuck_id, "Completed", "Failed", timeout_s=30)
    assert done["status"]["phase"] == "Completed", done["status"]
    attempts = done["status"]["attempts"]
    assert [(a["reason"], a["outcome"]) for a in attempts] == [("started", "hung"), ("hung", "completed")]
    text = await logs_containing(api, project, stuck_id, "attempt 2 resumed from")
    saved = int(re.search(r"saved (\d+); now stuck", text).group(1))
    assert f"attempt 2 resumed from {saved}" in text
    calm = await wait_phase(api, project, quiet_id, "Completed", "Failed", timeout_s=30)
    assert [(a["reason"], a["outcome"]) for a in calm["status"]["attempts"]] == [("started", "completed")]
    assert await _notices(api, project, quiet_id) == []


async def _notices(api, project, job_id):
    items = (await api.get(f"/v2/{project}/notifications")).json()["items"]
    return [n for n in items if n["job_id"] == job_id]
