"""The simulator replays a small trace through the same policy functions."""

import json

import pytest

from services.placement.sim.cli import main

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p-0,4000,8192,1,1000,,LS,Running,0,1000,0
p-1,4000,8192,1,500,,LS,Running,10,1010,10
p-2,4000,8192,1,1000,G2,BE,Running,20,520,20
p-3,4000,8192,0,0,,LS,Running,30,100,30
p-4,4000,8192,1,1000,,BE,Pending,40,90,
"""
NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,32000,131072,1,G2
n-1,32000,131072,1,G2
"""


@pytest.fixture()
def trace(tmp_path):
    pods, nodes = tmp_path / "pods.csv", tmp_path / "nodes.csv"
    pods.write_text(PODS)
    nodes.write_text(NODES)
    return ["--pods", str(pods), "--nodes", str(nodes), "--local-only-frac", "0", "--cloud-only-frac", "0", "--json"]


def _run(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_trace_filtering_is_counted(trace, capsys):
    result = _run(capsys, trace + ["--policy", "wait-local", "--local", "2", "--reserved", "0"])

    assert result["jobs"] == 3 and result["finished"] == 3
    assert result["skipped_no_gpu"] == 1 and result["skipped_never_scheduled"] == 1
    assert result["fractional_gpu_rounded_up"] == 1


def test_owned_only_run_times_match_the_trace_at_reference_speed(trace, capsys):
    result = _run(capsys, trace + ["--policy", "local-fifo", "--local", "2", "--reserved", "0"])

    # p-0 and p-1 take both nodes; p-2 waits until p-0 ends at 1000 and runs 500 s.
    assert result["avg_jct_s"] == pytest.approx((1000 + 1000 + (1500 - 20)) / 3, abs=0.1)
    assert result["on_demand_dollars"] == 0.0


def test_burst_pays_when_owned_capacity_is_full_and_wait_local_does_not(trace, capsys):
    burst = _run(capsys, trace + ["--policy", "burst", "--local", "1", "--reserved", "0"])
    wait = _run(capsys, trace + ["--policy", "wait-local", "--local", "1", "--reserved", "0"])

    assert burst["on_demand_nodes_created"] >= 1 and burst["on_demand_dollars"] > 0
    assert wait["on_demand_dollars"] == 0.0 and wait["finished"] == 3
    assert burst["on_demand_node_hours"] > 0


def test_every_policy_finishes_the_trace(trace, capsys):
    for policy in ("trainmaster", "burst", "local-fifo", "wait-local"):
        result = _run(capsys, trace + ["--policy", policy, "--local", "1", "--reserved", "1"])
        assert result["finished"] == 3, policy


def test_jobs_replays_each_side_at_the_command_lines_settings(trace, monkeypatch, capsys):
    """bench/sched/jobs.py sets one setting against the other (`--against-owned-wait-order`); every other setting of
    the command line holds for both sides (it read only the exchange rate before)."""
    from bench.sched import jobs

    seen = []

    class Seen(jobs.Recorded):
        def __init__(self, *args, config, **kwargs):
            seen.append((config.policy, config.owned_wait_order, config.exchange_rate, config.one_owned_queue))
            super().__init__(*args, config=config, **kwargs)

    monkeypatch.setattr(jobs, "Recorded", Seen)
    argv = ["--local", "1", "--reserved", "0", "--exchange-rate", "3", "--one-owned-queue", "on"]
    argv += ["--owned-wait-order", "on", "--against", "trainmaster", "--against-owned-wait-order", "off"]

    assert jobs.main(trace + argv) == 0
    assert seen == [("trainmaster", True, 3.0, True), ("trainmaster", False, 3.0, True)]
    assert "3 jobs finished under both" in capsys.readouterr().out
