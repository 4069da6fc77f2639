"""From inside a job: the platform's secrets in /proc, the data directory, another project's checkpoint and host
files are out of reach; a job's own project storage works. On a node of its own (two task uids, a small disk
quota): the next task on a uid finds nothing the last one left, a task sees no other task's process, memory
anywhere in the task counts, the disk quota holds, and a standard PyTorch job knows who it is."""

import json
import os
import sys
import uuid
from pathlib import Path
from shlex import quote

import pytest
import pytest_asyncio

from services.stack.processes import SERVICES
from tests.conftest import ADMIN_TOKEN, admin_client, start_stack, stop_later
from tests.e2e.helpers import logs, logs_containing, submit, wait_phase
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e

SAVE = (
    'import os, sys; open(os.path.join(os.environ["TRAINMASTER_CHECKPOINT_DIR"], "model.txt"), "w").write(sys.argv[1])'
)

PROBE = r"""
import glob, json, os, sys
data, other, secrets = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
result = {"uid": os.getuid(), "secrets_seen": [], "reads": {}}
for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/task/[0-9]*/environ"):
    try:
        text = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    result["secrets_seen"] += [s for s in secrets if s in text and s not in result["secrets_seen"]]
for path in [os.path.join(data, n) for n in ("admin-token", "creds", "db", "nats", "logs", "checkpoints")] + other:
    try:
        result["reads"][path] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path).read()
    except OSError as exc:
        result["reads"][path] = type(exc).__name__
result["input"] = open(os.path.join(os.environ["TRAINMASTER_INPUT_MINE"], "mine.txt")).read()
import socket
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[4])
    result["database"] = "connected"
except OSError as exc:
    result["database"] = type(exc).__name__
print("PROBE " + json.dumps(result), flush=True)
"""


async def test_a_job_cannot_reach_the_platform_or_another_projects_storage(api, stack, project):
    data = stack.data_dir
    owner, intruder = f"{project}-a"[-64:], f"{project}-b"[-64:]
    weights = f"weights-{uuid.uuid4().hex}"
    saver = await submit(api, owner, command=f"{sys.executable} -c {quote(SAVE)} {weights}")
    saver_id = saver["metadata"]["id"]
    done = await wait_phase(api, owner, saver_id, "Completed", "Failed")
    assert done["status"]["phase"] == "Completed", done["status"]
    checkpoint = data / "checkpoints" / owner / saver_id / "model.txt"  # <checkpoint root>/<project>/<job>
    assert checkpoint.read_text() == weights

    mine = data / "storage" / intruder / "in"
    mine.mkdir(parents=True)
    (mine / "mine.txt").write_text("my own data")
    others = [str(checkpoint), str(data / "checkpoints" / saver_id), str(data / "checkpoints" / owner)]
    secrets = [ADMIN_TOKEN, "MONGO_URL=", "TRAINMASTER_NATS"]
    probe = await submit(
        api,
        intruder,
        command=f"{sys.executable} -c {quote(PROBE)} {data} "
        f"{quote(json.dumps(others))} {quote(json.dumps(secrets))} "
        f"{stack.database_socket_of('submitter')}",
        inputs=[{"name": "mine", "url": f"file://{mine}"}],
    )
    done = await wait_phase(api, intruder, probe["metadata"]["id"], "Completed", "Failed")
    text = await logs_containing(api, intruder, probe["metadata"]["id"], "PROBE ")
    assert done["status"]["phase"] == "Completed", (done["status"], text)
    result = json.loads(next(line for line in text.splitlines() if line.startswith("PROBE "))[len("PROBE ") :])
    assert result["secrets_seen"] == [], result
    for path, outcome in result["reads"].items():
        assert outcome in ("PermissionError", "FileNotFoundError"), (path, outcome)
    assert result["uid"] != 0 and result["uid"] != os.geteuid()
    assert result["input"] == "my own data"  # its own project's storage is there
    # the database has no TCP port (nx-27017 has no authentication) and its socket is out of reach
    assert all(stack.mongo_url_of(service).startswith("mongodb://%2F") for service in SERVICES)
    assert result["database"] in ("PermissionError", "FileNotFoundError")

    refused = {
        "algorithm.inputs.0.url": {"inputs": [{"name": "passwd", "url": "file:///etc/passwd"}]},
        "algorithm.outputs.0.url": {"outputs": [{"name": "x", "url": f"file://{checkpoint.parent}"}]},
        "algorithm.code_dir": {"code_dir": f"file://{mine}/../../{owner}", "command": "true"},
    }
    for field, fields in refused.items():
        response = await api.post(f"/v2/{intruder}/training-jobs", json=job_body(**fields))
        assert response.status_code == 400, response.text
        assert response.json()["error_code"] == "406001" and f"param[{field}]" in response.json()["error_msg"]
    assert checkpoint.read_text() == weights


LONE = """
[[nodes]]
id = "lone-1"
kind = "local"
cpu_count = 8
memory_gb = 4
price_per_hour = 0.1
"""
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="tasks are users of their own only under a root agent")
SCRIPTS = Path(__file__).resolve().parent / "isolation_scripts"  # outside /tmp: tasks have a private /tmp


@pytest.fixture(scope="module")
def lone(tmp_path_factory, servers):
    # two uids: two tasks may run at once, and one after another they get the same uid
    stack = start_stack(
        tmp_path_factory.mktemp("lone"),
        cluster=LONE,
        servers=servers,
        extra_env={"TRAINMASTER_TASK_UID_COUNT": "2", "TRAINMASTER_TASK_DISK_GB": "0.1"},
    )
    yield stack
    stop_later(stack)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def admin(lone):
    async with admin_client(lone, timeout=60) as client:
        yield client


async def finished(
    api, project: str, command: str, *, last: str | None = "DONE", timeout_s: float = 120, **body
) -> tuple[dict, str]:
    """The job once it ended, and its log once `last` is in it (None: as it is then, a job that never prints it)."""
    job = await submit(api, project, command=command, **body)
    done = await wait_phase(api, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=timeout_s)
    if last is None:  # a finished status is shown once its tasks' output is stored (services/submitter/logs.py)
        return done, await logs(api, project, job["metadata"]["id"])
    return done, await logs_containing(api, project, job["metadata"]["id"], last)


def tagged(text: str, tag: str):
    return json.loads(next(line for line in text.splitlines() if line.startswith(tag + " "))[len(tag) + 1 :])


@ROOT_ONLY
async def test_the_next_task_on_a_uid_in_another_project_finds_no_shm_segment_or_lock_file(admin):
    os.makedirs("/run/lock", mode=0o1777, exist_ok=True)  # as every Debian host has it
    os.chmod("/run/lock", 0o1777)
    python = sys.executable
    done, left = await finished(admin, unique("tenant-a"), f"{python} {SCRIPTS / 'leave.py'}")
    assert done["status"]["phase"] == "Completed", (done["status"], left)
    done, found = await finished(admin, unique("tenant-b"), f"{python} {SCRIPTS / 'find.py'}")
    assert done["status"]["phase"] == "Completed", (done["status"], found)
    assert tagged(left, "LEFT")["uid"] == tagged(found, "FOUND")["uid"]  # the same uid, one task after the other
    assert tagged(found, "FOUND")["shm"] == [] and tagged(found, "FOUND")["files"] == []
    assert not os.path.exists("/run/lock/left-by-a") and not os.path.exists("/dev/shm/left-by-a")


@ROOT_ONLY
async def test_a_task_cannot_see_another_tasks_processes_or_command_line(admin):
    project = unique("procs")
    marker = f"secret-{uuid.uuid4().hex}"
    other = await submit(admin, project, command=f"sleep 120 || echo {marker}")
    await wait_phase(admin, project, other["metadata"]["id"], "Running")
    done, seen = await finished(admin, project, f"{sys.executable} {SCRIPTS / 'procs.py'} {marker[:10]} {marker[10:]}")
    await admin.post(
        f"/v2/{project}/training-jobs/{other['metadata']['id']}/actions", json={"action_type": "terminate"}
    )
    assert done["status"]["phase"] == "Completed", (done["status"], seen)
    result = tagged(seen, "PROCS")
    assert result["seen"] == [] and result["count"] <= 4, result  # its PID 1, its shell, itself


async def test_memory_held_by_a_detached_process_is_out_of_memory_at_memory_gb(admin):
    project = unique("hog")
    # a quarter of the sizes it once had (3 GB in 1, 2 and 4 GB: 6 GB written, ~10 s of the suite's CPU), the same
    # doubling and the same claim
    job = await submit(admin, project, command=f"{sys.executable} {SCRIPTS / 'hog.py'} 768", memory_gb=0.25)
    done = await wait_phase(admin, project, job["metadata"]["id"], "Completed", "Failed", timeout_s=180)
    outcomes = [a["outcome"] for a in done["status"]["attempts"]]
    assert outcomes == ["oom", "oom", "completed"], done["status"]  # 0.25 GB, 0.5 GB, then 1 GB holds the 768 MB


async def test_a_task_writing_past_the_disk_quota_is_stopped(admin):
    done, text = await finished(admin, unique("disk"), f"{sys.executable} {SCRIPTS / 'fill.py'} 300", last=None)
    assert done["status"]["phase"] == "Failed", (done["status"], text)
    assert "wrote more than 0.1 GB to its work directory" in done["status"]["task_statuses"][0]["message"]
    assert "DONE" not in text


async def test_a_standard_pytorch_job_knows_its_user_and_compiles(api, project):
    # on the shared stack: inductor's precompiled header alone is larger than the small node's disk quota; its C++
    # compile is ~45 s of CPU (two cores busy with other work: 120 s was not always enough)
    script = f"{sys.executable} {SCRIPTS / 'torch_user.py'}"
    # two CPUs: its compile workers size themselves to the CPUs it may use, and its cgroup caps its time at them
    done, text = await finished(api, project, script, memory_gb=4, cpu_count=2, timeout_s=240)  # pytest-timeout 300 s
    assert done["status"]["phase"] == "Completed", (done["status"], text)
    who = tagged(text, "WHO")
    assert who["getuser"] == who["pwd"] == who["USER"] and who["home"] == who["HOME"], who
    assert who["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and who["compiled"] == [1.0, 1.0, 1.0]


async def test_a_dataloader_with_worker_processes_gets_its_batches(api, project):
    """Found on the first real-GPU run: the workers' Unix socket under the task's long TMPDIR could not be bound, and
    the job waited for its first batch for ever. TMPDIR is now a short link to the task's own tmp/ directory."""
    done, text = await finished(api, project, f"{sys.executable} {SCRIPTS / 'dataloader_workers.py'}", memory_gb=4)
    assert done["status"]["phase"] == "Completed", (done["status"], text)
    loaded = tagged(text, "LOADED")
    assert loaded["sum"] == sum(range(512))
    assert len(loaded["tmpdir"]) < 40 and loaded["real"].endswith("/tmp"), loaded  # the task's own directory


async def test_a_torchrun_job_with_two_local_ranks_runs(api, project):
    """torchrun starts its ranks, their rendezvous and their workers inside the task's own namespaces."""
    worker = SCRIPTS / "torchrun_worker.py"
    command = f"{sys.executable} -m torch.distributed.run --standalone --nproc_per_node 2 {worker} && echo DONE"
    done, text = await finished(
        api, project, command, memory_gb=4, cpu_count=2, environments={"OMP_NUM_THREADS": "1"}
    )  # a CPU for each rank
    assert done["status"]["phase"] == "Completed", (done["status"], text)
    ranks = tagged(text, "RANKS")
    assert ranks["world"] == 2 and ranks["all_reduce"] == 3.0, ranks
    assert sorted((r["rank"], r["local_rank"], r["seen"]) for r in ranks["ranks"]) == [(0, 0, 128.0), (1, 1, 256.0)]
