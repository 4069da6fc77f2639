"""A task's environment is an allow-list of the agent's, plus the job's variables and ours: no secret passes."""

from pathlib import Path

from shared.events import StartTask
from shared.jobs import Algorithm
from services.agent.runner import agent_account, task_environment
from tests.factories import node, spec

AGENT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "TRAINMASTER_ADMIN_TOKEN": "admin",
    "TRAINMASTER_NATS_URL": "nats://u:p@bus:4222",
    "MONGO_URL": "mongodb://x",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "HF_TOKEN": "hf_agent",
    "NATS_CREDS": "/c",
    "PYTHONPATH": "/repo",
    "LD_PRELOAD": "/evil.so",
    "HOME": "/root",
    "SSH_AUTH_SOCK": "/tmp/ssh",
}


def environment(**algorithm) -> dict[str, str]:
    start = StartTask(
        event_id="j:1:0:start",
        node_id="n1",
        job_id="j",
        attempt=1,
        project_id="p",
        user_name="a",
        algorithm=Algorithm(command="true", **algorithm),
        spec=spec(),
    )
    return task_environment(start, node(node_id="n1"), workdir=Path("/w/attempt"), base=AGENT_ENV, sdk_dir=Path("/sdk"))


def test_only_allowed_variables_of_the_agent_reach_the_task():
    env = environment()
    inherited = {k for k in env if k in AGENT_ENV}
    assert inherited == {"PATH", "LANG", "LC_ALL", "TZ", "HOME", "PYTHONPATH"}
    assert env["HOME"] == "/w/attempt" and env["TMPDIR"] == "/w/attempt/tmp"  # ours, not the agent's
    assert env["PYTHONPATH"] == "/sdk"  # the agent's own path to its code is not passed on
    assert not any(secret in value for value in env.values() for secret in ("admin", "nats://", "AKIA", "hf_agent"))


def test_the_jobs_own_variables_and_parameters_are_kept_and_ours_win():
    env = environment(
        environments={"HF_TOKEN": "hf_job", "PYTHONPATH": "/mine"}, parameters=[{"name": "lr", "value": "0.1"}]
    )
    assert env["HF_TOKEN"] == "hf_job" and env["lr"] == "0.1"
    assert env["PYTHONPATH"] == "/sdk:/mine" and env["TRAINMASTER_JOB_ID"] == "j"


def test_every_task_numbers_gpus_by_pci_bus_and_has_a_name_and_caches_of_its_own():
    env = environment(environments={"CUDA_DEVICE_ORDER": "FASTEST_FIRST", "USER": "root"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA_VISIBLE_DEVICES then means what NVML (and we) mean
    assert env["USER"] == env["LOGNAME"] == agent_account()  # the job cannot claim another name
    assert env["XDG_CACHE_HOME"] == "/w/attempt/.cache"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith("/w/attempt/") and env["TRITON_CACHE_DIR"].startswith("/w/")
