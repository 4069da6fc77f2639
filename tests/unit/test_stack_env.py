"""What `make run` hands its processes: the platform services see no GPU (they are the tasks'), agents see theirs."""

from services.stack.processes import SERVICES, Stack
from services.stack.settings import StackSettings
from tests.unit.test_stack_restart import CLUSTER, stack_of


def test_the_platform_services_see_no_gpu_whatever_the_operators_shell_shows(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    stack = stack_of(tmp_path)
    assert {name: stack.env_of(name).get("CUDA_VISIBLE_DEVICES") for name in SERVICES} == dict.fromkeys(SERVICES, "")
    assert set(SERVICES) >= {"estimator", "placement", "monitor", "billing", "submitter"}


def test_an_agent_keeps_the_gpus_it_gives_its_tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert stack_of(tmp_path).env_of("agent-n1")["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_agents_sharing_the_host_leave_their_tasks_cpus_to_the_kernel_and_a_lone_agent_pins_them(tmp_path):
    """Agents on one host cannot share its CPUs out between them: each would pin its first task to the same CPU."""
    alone = stack_of(tmp_path)
    assert "TRAINMASTER_TASK_PIN_CPUS" not in alone.env_of("agent-n1")  # one node on this host: its agent pins
    two = tmp_path / "two"
    two.mkdir()
    (two / "cluster.toml").write_text(CLUSTER + CLUSTER.replace('"n1"', '"n2"'))
    shared = Stack(StackSettings(data_dir=two, cluster_file=two / "cluster.toml", mongo_url=None, nats_url=None))
    assert shared.env_of("agent-n1")["TRAINMASTER_TASK_PIN_CPUS"] == "false"
    assert shared.env_of("placement")["TRAINMASTER_TASK_PIN_CPUS"] == "false"  # and the nodes it starts here
