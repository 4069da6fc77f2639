from services.placement.fit import Candidate, Usage, choose, schedule
from shared.jobs import Resource
from tests.factories import node


def candidate(job_id="j", *, allowed="any", priority="time", at=0.0, **resource):
    return Candidate(job_id=job_id, resource=Resource(**resource), allowed=allowed, priority=priority,
                     submitted_at=at)


def test_min_gpu_memory_and_count_are_respected():
    small, big = node(node_id="small", gpus=2, gpu_memory_gb=16), node(node_id="big", gpus=1, gpu_memory_gb=80)
    a = choose(candidate(gpu_count=1, min_gpu_memory_gb=40), [small, big], {})
    assert a[0].node_id == "big"
    assert choose(candidate(gpu_count=2, min_gpu_memory_gb=40), [small, big], {}) is None


def test_local_only_never_uses_cloud_and_cloud_only_never_local():
    local, cloud = node(node_id="l", kind="local"), node(node_id="c", kind="on_demand")
    assert choose(candidate(allowed="local"), [cloud], {}) is None
    assert choose(candidate(allowed="cloud"), [local, cloud], {})[0].node_id == "c"


def test_used_gpus_are_not_given_twice():
    n = node(node_id="n", gpus=2)
    decisions = schedule([candidate("a", gpu_count=1), candidate("b", gpu_count=1, at=1),
                          candidate("c", gpu_count=1, at=2)], [n], {})
    assert [(j, a[0].gpu_indices) for j, a in decisions] == [("a", (0,)), ("b", (1,))]


def test_a_gang_goes_all_or_nothing_on_nodes_of_one_kind():
    nodes = [node(node_id="l1", kind="local"), node(node_id="r1", kind="reserved"),
             node(node_id="r2", kind="reserved")]
    a = choose(candidate(node_count=2, gpu_count=1), nodes, {})
    assert {x.node_id for x in a} == {"r1", "r2"}
    assert choose(candidate(node_count=3, gpu_count=1), nodes, {}) is None


def test_cpu_and_memory_limits_hold():
    n = node(node_id="n", cpu=4, memory_gb=8)
    usage = {"n": Usage(cpu=3.5)}
    assert choose(candidate(cpu_count=1), [n], usage) is None
    assert choose(candidate(cpu_count=0.5, memory_gb=8), [n], usage) is not None


def test_cost_sensitive_prefers_the_cheapest_and_time_sensitive_the_fastest():
    cheap = node(node_id="cheap", price=0.5, tflops=50)
    fast = node(node_id="fast", price=4.0, tflops=300)
    assert choose(candidate(priority="cost", gpu_count=1), [fast, cheap], {})[0].node_id == "cheap"
    assert choose(candidate(priority="time", gpu_count=1), [cheap, fast], {})[0].node_id == "fast"
