"""`make run` supervises: a process that exited is started again as it was (a service replica on its own port)."""
from services.stack.processes import Stack, StackSettings

CLUSTER = '[[nodes]]\nid = "n1"\nkind = "local"\ncpu_count = 4\nmemory_gb = 8\nprice_per_hour = 0.1\n'


def test_each_kind_of_process_is_started_again_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    stack = Stack(StackSettings(data_dir=tmp_path, cluster_file=tmp_path / "cluster.toml", service_replicas=2,
                                nats_servers=3, mongo_url=None, nats_url=None))
    started = []
    monkeypatch.setattr(stack, "start_service", lambda name, *, replica=1: started.append(("service", name, replica)))
    monkeypatch.setattr(stack, "start_agent", lambda node: started.append(("agent", node)))
    monkeypatch.setattr(stack, "start_nats_server", lambda name: started.append(("nats", name)))
    for name in ("placement-2", "monitor", "agent-n1", "nats-3"):
        assert stack.restart(name)
    assert started == [("service", "placement", 2), ("service", "monitor", 1), ("agent", "n1"), ("nats", "nats-3")]
    assert not stack.restart("database") and not stack.restart("agent-unknown") and not stack.restart("nats-4")
