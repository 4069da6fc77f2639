"""Host memory of a job that names none: a GPU job gets its GPUs' share of the node it is placed on (CUDA's own
libraries take more than a GB of host memory), a job without GPUs the old 1 GB; what a job asks for stands."""

import pytest

from shared.jobs import CPU_JOB_MEMORY_GB, Resource, host_memory_gb
from services.placement.policy import Start, Wait
from services.placement.policy.engine import place
from services.placement.policy.hosting import could_host
from tests.unit.placement.placement_factories import config, make_job, make_node, make_state


def test_a_resource_without_host_memory_leaves_it_to_placement():
    assert Resource(gpu_count=1).memory_gb is None and Resource(memory_gb=2).memory_gb == 2


@pytest.mark.parametrize(
    "gpus, node_gpus, node_memory, expected",
    [
        (1, 4, 64.0, 16.0),
        (4, 4, 64.0, 64.0),
        (2, 8, 1024.0, 256.0),
        (1, 1, 12.0, 12.0),
    ],
)
def test_a_gpu_job_gets_its_gpus_share_of_the_nodes_memory(gpus, node_gpus, node_memory, expected):
    assert host_memory_gb(None, gpus=gpus, node_memory_gb=node_memory, node_gpus=node_gpus) == expected


def test_what_a_job_asks_for_stands_and_a_job_without_gpus_keeps_one_gb():
    assert host_memory_gb(3.0, gpus=1, node_memory_gb=64, node_gpus=4) == 3.0
    assert host_memory_gb(None, gpus=0, node_memory_gb=64, node_gpus=4) == CPU_JOB_MEMORY_GB == 1.0


@pytest.mark.parametrize("node_gpus", [1, 2, 4, 8])
@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_a_default_cuda_job_gets_at_least_8_gb_per_gpu_on_a_node_of_8_gb_per_gpu(gpus, node_gpus):
    if gpus > node_gpus:
        pytest.skip("the job does not fit such a node")
    assert host_memory_gb(None, gpus=gpus, node_memory_gb=8.0 * node_gpus, node_gpus=node_gpus) >= 8.0 * gpus


def test_a_default_gpu_job_waits_for_a_node_with_its_share_of_memory_free():
    short = make_node(gpu_count=2, memory_gb=32.0, free_memory_gb=10.0)  # jobs without GPUs hold 22 GB of it
    roomy = make_node(gpu_count=2, memory_gb=32.0, free_memory_gb=32.0)
    job = make_job(gpu_count=1, memory_gb=None)
    [start] = place(make_state(nodes=(short, roomy), queue=(job,)), 0.0, config())
    assert start == Start(job.id, (roomy.id,), ((0,),))


def test_default_gpu_jobs_take_their_share_from_what_jobs_without_gpus_may_use():
    box = make_node(gpu_count=2, memory_gb=32.0, free_memory_gb=32.0)
    gpu_jobs = [make_job(gpu_count=1, memory_gb=None, submitted_at=float(i)) for i in range(2)]
    cpu_job = make_job(gpu_count=0, cpu=1.0, memory_gb=8.0, submitted_at=9.0)
    decisions = place(make_state(nodes=(box,), queue=(*gpu_jobs, cpu_job)), 0.0, config())
    assert [type(d) for d in decisions] == [Start, Start, Wait]


def test_a_node_can_always_host_its_own_share_but_not_more_than_it_has():
    node = make_node(gpu_count=4, memory_gb=64.0)
    assert could_host(node, make_job(gpu_count=4, memory_gb=None))
    assert not could_host(node, make_job(gpu_count=1, memory_gb=65.0))
    assert make_job(gpu_count=1, memory_gb=None).memory_on(node.memory_gb, node.gpu_count) == 16.0
