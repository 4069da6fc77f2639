"""`make run` supervises: a process that exited is started again as it was (a service replica on its own port)."""

import time

import pytest

from services.stack import processes
from services.stack.processes import Stack, StackSettings

CLUSTER = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\nprice_per_hour = 0.1\n'


def test_each_kind_of_process_is_started_again_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    stack = Stack(
        StackSettings(
            data_dir=tmp_path,
            cluster_file=tmp_path / "cluster.toml",
            service_replicas=2,
            nats_servers=3,
            mongo_url=None,
            nats_url=None,
        )
    )
    started = []
    monkeypatch.setattr(stack, "start_service", lambda name, *, replica=1: started.append(("service", name, replica)))
    monkeypatch.setattr(stack, "start_agent", lambda node: started.append(("agent", node)))
    monkeypatch.setattr(stack, "start_nats_server", lambda name: started.append(("nats", name)))
    for name in ("placement-2", "monitor", "agent-n1", "nats-3"):
        assert stack.restart(name)
    assert started == [("service", "placement", 2), ("service", "monitor", 1), ("agent", "n1"), ("nats", "nats-3")]
    assert not stack.restart("database") and not stack.restart("agent-unknown") and not stack.restart("nats-4")
    assert not stack.restart("database-unknown")


def stack_of(tmp_path) -> Stack:
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    return Stack(
        StackSettings(data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", mongo_url=None, nats_url=None)
    )


def test_a_service_that_exits_while_the_stack_starts_is_started_again_and_the_stack_comes_up(tmp_path, monkeypatch):
    # the API's first replica timed out on a NATS cluster still electing its leaders and exited (seen in CI)
    monkeypatch.setattr(processes, "RESTART_AFTER_S", 0.2)  # up that long after its restart, it counts
    stack = stack_of(tmp_path)
    dead, started = ["submitter"], []
    monkeypatch.setattr(stack, "dead", lambda: list(dead))
    monkeypatch.setattr(stack, "restart", lambda name: started.append(name) or dead.remove(name) or True)

    def port(_, *, timeout_s):  # listens once the submitter was started again
        if "submitter" not in started:
            raise TimeoutError("nothing listens")

    monkeypatch.setattr(processes, "wait_for_port", port)
    stack.wait_serving(timeout_s=5)
    assert started == ["submitter"]


def test_one_that_keeps_exiting_is_started_at_most_every_few_seconds_and_the_wait_still_ends(tmp_path, monkeypatch):
    stack = stack_of(tmp_path)
    started = []
    monkeypatch.setattr(stack, "dead", lambda: ["submitter"])
    monkeypatch.setattr(stack, "restart", lambda name: started.append(name) or True)
    monkeypatch.setattr(processes, "wait_for_port", lambda _, *, timeout_s: None)
    with pytest.raises(TimeoutError, match="did not stay up: \\['submitter'\\]"):
        stack.wait_serving(timeout_s=0.3)
    assert started == ["submitter"]  # once in 0.3 s
    restarted = {"submitter": time.monotonic() - processes.RESTART_AFTER_S - 1}  # long enough ago
    assert stack.restart_dead(restarted) == [("submitter", True)]
    assert stack.restart_dead(restarted) == []


def test_a_process_that_cannot_be_started_again_fails_the_wait_naming_it(tmp_path, monkeypatch):
    # it was left out of the processes waited for: the stack served without it, and no error said so
    stack = stack_of(tmp_path)
    started = []
    monkeypatch.setattr(stack, "dead", lambda: ["database"])
    monkeypatch.setattr(stack, "restart", lambda name: started.append(name) and False)
    monkeypatch.setattr(processes, "wait_for_port", lambda _, *, timeout_s: None)
    with pytest.raises(RuntimeError, match="cannot be started again: \\['database'\\]"):
        stack.wait_serving(timeout_s=5)
    assert started == ["database"]


def test_a_process_started_again_counts_once_it_stayed_up(tmp_path, monkeypatch):
    # the wait returned at the first look that found it alive: here it exits again right after that look
    monkeypatch.setattr(processes, "RESTART_AFTER_S", 0.2)
    stack = stack_of(tmp_path)
    started, looks_alive = [], [0]

    def dead() -> list[str]:
        if looks_alive[0]:
            looks_alive[0] -= 1
            return []
        return ["agent-n1"]

    def restart(name: str) -> bool:
        started.append(name)
        looks_alive[0] = 1 if len(started) == 1 else 10**6  # the first start lasts one look, the second holds
        return True

    monkeypatch.setattr(stack, "dead", dead)
    monkeypatch.setattr(stack, "restart", restart)
    monkeypatch.setattr(processes, "wait_for_port", lambda _, *, timeout_s: None)
    stack.wait_serving(timeout_s=5)
    assert started == ["agent-n1", "agent-n1"]


def test_the_stack_serves_once_every_api_replica_answers_the_second_started_again_if_it_exited(tmp_path, monkeypatch):
    # the failover test's stack: the second API replica's first bus request timed out and it exited, while the
    # first answered; the stack went on with one replica, and killing that one left none
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    settings = StackSettings(
        data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", mongo_url=None, nats_url=None, service_replicas=2
    )
    stack = Stack(settings)
    monkeypatch.setattr(processes, "RESTART_AFTER_S", 0.2)
    dead, started = ["submitter-2"], []
    monkeypatch.setattr(stack, "dead", lambda: list(dead))
    monkeypatch.setattr(stack, "restart", lambda name: started.append(name) or dead.remove(name) or True)

    def port(number, *, timeout_s):  # the first replica listens; the second once it was started again
        if number != settings.api_port and "submitter-2" not in started:
            raise TimeoutError("nothing listens")

    monkeypatch.setattr(processes, "wait_for_port", port)
    stack.wait_serving(timeout_s=5)
    assert started == ["submitter-2"] and stack.api_ports() == [settings.api_port, settings.api_port + 1]


def test_an_agent_that_exited_while_the_api_answers_is_started_again_before_the_stack_serves(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "RESTART_AFTER_S", 0.2)
    stack = stack_of(tmp_path)
    dead, started = ["agent-n1"], []
    monkeypatch.setattr(stack, "dead", lambda: list(dead))
    monkeypatch.setattr(stack, "restart", lambda name: started.append(name) or dead.remove(name) or True)
    monkeypatch.setattr(processes, "wait_for_port", lambda _, *, timeout_s: None)
    stack.wait_serving(timeout_s=5)
    assert started == ["agent-n1"]
