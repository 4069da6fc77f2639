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


def test_cloud_credentials_in_the_shell_reach_only_the_processes_that_use_a_cloud(tmp_path, monkeypatch):
    """Placement rents with them and agents reach object storage with them; every other service got them too."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wide-open")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/sa.json")
    stack = stack_of(tmp_path)
    for name in ("submitter", "monitor", "estimator", "billing"):
        env = stack.env_of(name)
        assert "AWS_SECRET_ACCESS_KEY" not in env and "GOOGLE_APPLICATION_CREDENTIALS" not in env, name
    assert stack.env_of("placement")["AWS_SECRET_ACCESS_KEY"] == "wide-open"
    assert stack.env_of("agent-n1")["AWS_SECRET_ACCESS_KEY"] == "wide-open"


def test_a_database_socket_folder_another_user_made_first_is_refused(tmp_path, monkeypatch):
    """A deep data directory's sockets go under the shared temporary directory, in a folder of a predictable name:
    one another user made there first was taken as it was, holding the socket every service talks to."""
    import os

    import pytest

    if os.geteuid() != 0:
        pytest.skip("another user's folder is made by root")
    stack = stack_of(tmp_path)
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    os.chown(folder, 65534, 65534)  # made first by nobody
    monkeypatch.setattr(Stack, "database_socket_of", lambda self, service: folder / f"{service}.sock")
    with pytest.raises(SystemExit, match="not a folder of this user's own"):
        stack.start_database_server("billing")
    assert "database-billing" not in stack.processes
