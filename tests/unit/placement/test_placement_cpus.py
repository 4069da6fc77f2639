"""A rank with GPUs takes at least its GPUs' share of its node's CPUs (`shared.jobs.task_cpus`): the agent pins it to
as many and caps its CPU time there, so placement counts as many against the node, in a pass and in what placed jobs
hold; the simulator's trace jobs keep what they asked."""

from datetime import UTC, datetime

import pytest

from shared.events import Assignment
from shared.jobs import Spec, task_cpus
from services.placement.inputs import usage
from services.placement.policy import Start, Wait
from services.placement.policy.engine import place
from services.placement.queue import QueueItem
from tests.factories import algorithm, node
from tests.unit.placement.placement_factories import config, make_job, make_node, make_state


def test_a_gpu_job_holds_its_gpus_share_of_the_nodes_cpus_so_a_cpu_job_waits_for_the_rest():
    """1 GPU of an 8-GPU, 128-CPU node: 16 CPUs (the agent's), not the 1 it asked; a job asking 120 then waits."""
    box = make_node(gpu_count=8, cpu=128.0, free_cpu=128.0, memory_gb=1024.0, free_memory_gb=1024.0)
    gpu_job = make_job(gpu_count=1, cpu=1.0, cpus_at_gpu_share=True, submitted_at=0.0)
    wide = make_job(gpu_count=0, cpu=120.0, memory_gb=1.0, submitted_at=1.0)
    narrow = make_job(gpu_count=0, cpu=112.0, memory_gb=1.0, submitted_at=2.0)
    decisions = place(make_state(nodes=(box,), queue=(gpu_job, wide)), 0.0, config())
    assert [type(d) for d in decisions] == [Start, Wait]
    decisions = place(make_state(nodes=(box,), queue=(gpu_job, narrow)), 0.0, config())
    assert [type(d) for d in decisions] == [Start, Start]


def test_gpu_jobs_wait_once_their_shares_would_pass_the_cpus_jobs_without_gpus_left():
    """A 4-GPU, 64-CPU node where jobs without GPUs hold 24 CPUs: two 1-GPU ranks of 16 CPUs fit, a third waits
    though a GPU is free (counted at the 1 CPU each asked, all four would start and the agent would pin 64 CPUs'
    worth beside the 24)."""
    box = make_node(gpu_count=4, cpu=64.0, free_cpu=40.0, memory_gb=256.0, free_memory_gb=256.0)
    jobs = tuple(make_job(gpu_count=1, cpu=1.0, cpus_at_gpu_share=True, submitted_at=float(i)) for i in range(4))
    decisions = place(make_state(nodes=(box,), queue=jobs), 0.0, config())
    assert [type(d) for d in decisions].count(Start) == 2
    asked_more = make_job(gpu_count=1, cpu=40.0, cpus_at_gpu_share=True)  # what it asked, above its share, stands
    assert [type(d) for d in place(make_state(nodes=(box,), queue=(asked_more,)), 0.0, config())] == [Start]


def test_a_job_of_the_simulators_trace_takes_what_it_asked():
    box = make_node(gpu_count=8, cpu=128.0, free_cpu=128.0, memory_gb=1024.0, free_memory_gb=1024.0)
    trace_job = make_job(gpu_count=1, cpu=1.0, submitted_at=0.0)
    wide = make_job(gpu_count=0, cpu=120.0, memory_gb=1.0, submitted_at=1.0)
    assert [type(d) for d in place(make_state(nodes=(box,), queue=(trace_job, wide)), 0.0, config())] == [Start, Start]


@pytest.mark.parametrize(
    "asked, gpus, node_cpus, node_gpus, held",
    [
        (1, 1, 128, 8, 16),  # its GPU's share
        (32, 1, 128, 8, 32),  # asked for more: what it asked
        (1, 2, 16, 2, 16),  # every GPU: the whole node
        (0.5, 1, 6, 4, 1.5),
        (4, 3, 8, 8, 4),
        (2, 0, 64, 8, 2),  # no GPUs: what it asked
    ],
)
def test_what_placed_jobs_hold_of_a_node_is_what_its_agent_gives_them(asked, gpus, node_cpus, node_gpus, held):
    """The CPUs a placed rank holds in placement's count are those the agent pins it to (the same function of the
    same launch and node); a node placement does not know is counted at what the job asked."""
    info = node(node_id="n1", gpus=node_gpus, cpu=node_cpus)
    item = QueueItem(
        job_id="j",
        project_id="p",
        user_name="alice",
        algorithm=algorithm(),
        spec=Spec.model_validate({"resource": {"gpu_count": gpus, "cpu_count": asked}}),
        submitted_at=datetime(2026, 11, 29, tzinfo=UTC),
        state="placed",
        attempt=1,
        assignments=(Assignment(rank=0, node_id="n1", gpu_indices=tuple(range(gpus))),),
    )
    assert task_cpus(asked, gpus=gpus, node_cpus=info.cpu_count, node_gpus=len(info.gpus)) == held  # the agent's
    assert usage([item], {"n1": info}.get)["n1"].cpu == held
    assert usage([item])["n1"].cpu == asked
