"""Keyword-argument factories for placement policy tests."""

import itertools

from services.placement.policy import ClusterState, InstanceType, JobRequest, Node, PolicyConfig, RunningJob

_ids = itertools.count()


def make_node(**overrides) -> Node:
    n = next(_ids)
    gpu_count = overrides.pop("gpu_count", 2)
    free = overrides.pop("free", gpu_count)
    fields = dict(
        id=f"node-{n}",
        kind="local",
        gpu_model="V100",
        gpu_count=gpu_count,
        gpu_memory_gb=16.0,
        tflops=10.0,
        cpu=32.0,
        memory_gb=128.0,
        price_per_hour=0.5 * gpu_count,
        free_gpu_indices=tuple(range(free)),
        free_cpu=32.0,
        free_memory_gb=128.0,
    )
    fields.update(overrides)
    return Node(**fields)


def make_job(**overrides) -> JobRequest:
    n = next(_ids)
    fields = dict(id=f"job-{n}", user="alice", submitted_at=0.0, expected_duration_s=3600.0)
    fields.update(overrides)
    return JobRequest(**fields)


def make_instance(**overrides) -> InstanceType:
    fields = dict(
        name="cloud.1gpu",
        gpus=1,
        gpu_model="V100",
        gpu_memory_gb=16.0,
        tflops=10.0,
        cpu=8.0,
        memory_gb=64.0,
        price_per_hour=3.0,
        startup_delay_s=120.0,
    )
    fields.update(overrides)
    return InstanceType(**fields)


def busy(node: Node, *, until: float, job: JobRequest | None = None) -> RunningJob:
    """A running job holding every GPU of `node` that is not free, expected to end at `until`."""
    held = tuple(i for i in range(node.gpu_count) if i not in node.free_gpu_indices)
    job = job or make_job(user="someone-else")
    return RunningJob(job=job, node_ids=(node.id,), gpu_indices=(held,), started_at=0.0, expected_end_at=until)


def make_state(**overrides) -> ClusterState:
    return ClusterState(**overrides)


def config(**overrides) -> PolicyConfig:
    fields = dict(reference_tflops=10.0)
    fields.update(overrides)
    return PolicyConfig(**fields)


def of_type(decisions, kind) -> list:
    return [d for d in decisions if isinstance(d, kind)]
