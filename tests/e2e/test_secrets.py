"""A job's secrets through the whole stack: in its task's environment, nowhere else (not the job's view, not a
stream, not another node, not its output), and gone once the job ends."""

import hashlib
import secrets
from pathlib import Path

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from pymongo import AsyncMongoClient

from shared.jobsecrets import SecretsQuery
from shared.settings import database_name
from services.agent.jobsecrets import ask
from tests.conftest import eventually
from tests.e2e.helpers import get, logs_containing, wait_phase
from tests.factories import job_body

pytestmark = pytest.mark.e2e
NODES = ("local-1", "local-2", "reserved-1", "ondemand-1")

PRINTS = (
    'python3 -c \'import hashlib, os, time; v = os.environ["WANDB_API_KEY"]; '
    'print("digest", hashlib.sha256(v.encode()).hexdigest(), flush=True); print("key", v, flush=True); '
    'time.sleep(float(os.environ["HOLD_S"])); raise SystemExit(3)\''
)


async def create(api, project: str, value: str, *, hold_s: float) -> dict:
    body = job_body(command=PRINTS, environments={"HOLD_S": str(hold_s)}, allowed="local")
    body["algorithm"]["secrets"] = {"WANDB_API_KEY": value}
    response = await api.post(f"/v2/{project}/training-jobs", json=body)
    assert response.status_code == 201, response.text
    assert value not in response.text
    return response.json()


async def as_node(stack, node_id: str) -> nats.NATS:
    return await nats.connect(
        stack.nats_url, user_credentials=str(stack.identities.creds(f"agent-{node_id}")), allow_reconnect=False
    )


def files_holding(root: Path, value: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and value in p.read_bytes()]


async def test_a_jobs_secret_reaches_its_task_alone(api, project, stack):
    value = f"wandb-{secrets.token_hex(16)}"
    job = await create(api, project, value, hold_s=8)
    job_id = job["metadata"]["id"]
    assert job["algorithm"]["secret_names"] == ["WANDB_API_KEY"]
    running = await wait_phase(api, project, job_id, "Running", "Failed", timeout_s=60)
    assert running["status"]["phase"] == "Running", running["status"]
    [node] = running["status"]["node_ids"]
    query = SecretsQuery(job_id=job_id, attempt=running["status"]["attempt"])

    elsewhere_id = next(n for n in NODES if n != node)
    other = await as_node(stack, elsewhere_id)
    refused = await ask(other, query, node_id=elsewhere_id)
    assert refused.final and refused.error == "that rank was not placed on this node" and not refused.values
    await other.close()

    own = await as_node(stack, node)
    watcher = await nats.connect(stack.nats_url, user_credentials=str(stack.admin_creds()))
    elsewhere = await watcher.subscribe("_INBOX_secrets.*.>")
    await watcher.flush()
    stray = f"_INBOX_secrets.{elsewhere_id}.stray"
    await own.publish(f"tm.rpc.submitter.secrets.{node}", query.model_dump_json().encode(), reply=stray)
    with pytest.raises(NatsTimeout):  # never answered into another node's space
        await elsewhere.next_msg(timeout=2)
    given = await ask(own, query, node_id=node)  # the node the attempt runs on: the value
    assert given.values == {"WANDB_API_KEY": value} and not given.error
    database = AsyncMongoClient(stack.mongo_url_of("submitter"))
    jobs = database[database_name("submitter")].api_jobs
    sealed = (await jobs.find_one({"_id": job_id}))["secret_values"]
    assert isinstance(sealed, str) and value not in sealed  # in the database only sealed

    done = await wait_phase(api, project, job_id, "Failed", "Completed", timeout_s=60)
    assert done["status"]["phase"] == "Failed"
    text = await logs_containing(api, project, job_id, "digest", "key ***")
    assert f"digest {hashlib.sha256(value.encode()).hexdigest()}" in text and value not in text
    assert value not in done["status"]["reason"]
    listed = await api.get(f"/v2/{project}/training-jobs")
    assert value not in listed.text and value not in (await api.get(f"/v2/{project}/training-jobs/{job_id}")).text
    ended = await ask(own, query, node_id=node)
    assert ended.final and ended.error == "the job has ended" and not ended.values
    stored = await jobs.find_one({"_id": job_id})
    await database.close()
    assert stored["secret_values"] == {}  # its end removed them
    for client in (own, watcher):
        await client.close()
    store = stack.data_dir / "nats"
    assert files_holding(store, b"HOLD_S") != []  # the job's plain environment is there to be found: the scan reads
    assert files_holding(store, value.encode()) == []  # in no stream, no consumer's state
    assert (await get(api, project, job_id))["algorithm"]["secret_names"] == ["WANDB_API_KEY"]


TRIAL = (
    'python3 -c \'import hashlib, os; v = os.environ["WANDB_API_KEY"]; '
    'print("digest", hashlib.sha256(v.encode()).hexdigest(), flush=True); print("key", v, flush=True); '
    'print("step 1 loss", os.environ["lr"], flush=True)\''
)


async def test_a_searchs_secret_reaches_each_trials_task_alone_and_a_job_may_not_name_them_itself(api, project, stack):
    body = job_body(command="true")
    body["algorithm"]["secret_names"] = ["WANDB_API_KEY"]
    response = await api.post(f"/v2/{project}/training-jobs", json=body)
    assert response.status_code == 400 and "algorithm.secret_names" in response.text, response.text
    value = f"wandb-{secrets.token_hex(16)}"
    template = job_body(command=TRIAL, allowed="local")
    template["algorithm"]["metrics"] = [{"name": "loss", "regex": r"step (?P<step>\d+) loss (?P<value>[0-9.]+)"}]
    search = {
        "name": project[-40:],
        "template": template,
        "space": {"lr": {"type": "float", "low": 0.01, "high": 0.1}},
        "objective": {"metric": "loss", "mode": "min"},
        "max_trials": 2,
        "parallelism": 2,
    }
    named = {**search, "template": {**template, "algorithm": {**template["algorithm"], "secret_names": ["X_KEY"]}}}
    response = await api.post(f"/v2/{project}/searches", json=named)
    assert response.status_code == 400 and "template.algorithm.secret_names" in response.text, response.text
    template["algorithm"]["secrets"] = {"WANDB_API_KEY": value}
    created = await api.post(f"/v2/{project}/searches", json=search)
    assert created.status_code == 201 and value not in created.text, created.text
    search_id = created.json()["metadata"]["id"]
    assert created.json()["spec"]["template"]["algorithm"]["secret_names"] == ["WANDB_API_KEY"]

    async def finished():
        found = (await api.get(f"/v2/{project}/searches/{search_id}")).json()
        return found if found["status"]["phase"] != "Running" else None

    done = await eventually(finished, timeout_s=60, interval_s=0.5)
    assert done["status"]["phase"] == "Completed" and value not in str(done), done
    digest = hashlib.sha256(value.encode()).hexdigest()
    for trial in done["trials"]:
        assert trial["state"] == "Completed", done["trials"]
        text = await logs_containing(api, project, trial["job_id"], "step 1 loss")
        assert f"digest {digest}" in text and "key ***" in text and value not in text  # its task had it, masked
        job = await get(api, project, trial["job_id"])
        assert job["algorithm"]["secret_names"] == ["WANDB_API_KEY"] and value not in str(job)
    database = AsyncMongoClient(stack.mongo_url_of("submitter"))
    stored = await database[database_name("submitter")].api_searches.find_one({"_id": search_id})
    await database.close()
    assert stored["secret_values"] == {}  # its end removed them (each trial kept its own until its end)
    assert value not in str(stored["spec"])
