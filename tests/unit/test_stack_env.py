"""What `make run` hands its processes: the platform services see no GPU (they are the tasks'), agents see theirs."""

from services.stack.processes import SERVICES
from tests.unit.test_stack_restart import stack_of


def test_the_platform_services_see_no_gpu_whatever_the_operators_shell_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    stack = stack_of(tmp_path)
    assert {name: stack.env_of(name).get("CUDA_VISIBLE_DEVICES") for name in SERVICES} == dict.fromkeys(SERVICES, "")
    assert set(SERVICES) >= {"estimator", "placement", "monitor", "billing", "submitter"}


def test_an_agent_keeps_the_gpus_it_gives_its_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert stack_of(tmp_path).env_of("agent-n1")["CUDA_VISIBLE_DEVICES"] == "0,1"
