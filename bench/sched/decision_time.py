"""Decision time of one scheduling pass at fleet scale (default 10,000 nodes and 10,000 queued jobs).

Usage: PYTHONPATH=. python bench/sched/decision_time.py [--nodes 10000 --jobs 10000 --repeats 5 --policy trainmaster]
"""

import argparse
import random
import statistics
import sys
import time

from services.placement.policy import ClusterState, JobRequest, Node, PolicyConfig, RunningJob, passes, schedule
from services.placement.policy.capacity import CapacityIndex
from services.placement.policy.passes import ALL_KINDS
from services.placement.sim.catalogue import DEFAULT_CATALOGUE

MODELS = (
    ("P100", 16, 9.3),
    ("T4", 16, 8.1),
    ("V100M16", 16, 15.7),
    ("V100M32", 32, 15.7),
    ("A10", 24, 15.6),
    ("G2", 24, 12.0),
    ("G3", 32, 20.0),
)
KINDS = ("local",) * 4 + ("reserved",) * 3 + ("on_demand",) * 3


def fleet(rng: random.Random, count: int, now: float) -> tuple[list[Node], list[RunningJob]]:
    """Nodes of every kind and model; about 70% of GPUs busy with jobs ending within a day."""
    nodes, running = [], []
    for n in range(count):
        model, memory, tflops = rng.choice(MODELS)
        gpus = rng.choice((1, 2, 4, 8))
        busy = tuple(i for i in range(gpus) if rng.random() < 0.7)
        node = Node(
            f"n{n}",
            rng.choice(KINDS),
            model,
            gpus,
            memory,
            tflops,
            16.0 * gpus,
            64.0 * gpus,
            0.6 * gpus,
            tuple(i for i in range(gpus) if i not in busy),
            16.0 * (gpus - len(busy)),
            64.0 * (gpus - len(busy)),
            idle_since=None,
        )
        nodes.append(node)
        if busy:
            job = JobRequest(f"r{n}", "u0", 0.0, 3600.0, gpu_count=len(busy))
            running.append(RunningJob(job, (node.id,), (busy,), 0.0, now + rng.uniform(60, 86400)))
    return nodes, running


def queue(rng: random.Random, count: int, now: float) -> list[JobRequest]:
    jobs = []
    for n in range(count):
        gpus = rng.choices((1, 2, 4, 8), weights=(80, 10, 6, 4))[0]
        duration = rng.lognormvariate(7.0, 1.5)
        jobs.append(
            JobRequest(
                f"q{n}",
                f"user{rng.randrange(200)}",
                now - rng.uniform(0, 86400),
                duration,
                allowed=rng.choice(("any", "any", "local", "cloud")),
                priority=rng.choice(("time", "cost")),
                gpu_count=gpus,
                min_gpu_memory_gb=rng.choice((0, 0, 0, 24)),
                node_count=2 if rng.random() < 0.01 else 1,
                deadline=now + duration * rng.uniform(1.5, 6),
                cpu=4.0 * gpus,
                memory_gb=16.0 * gpus,
            )
        )
    return jobs


def timed_take(stamps: list[float]):
    """Wrap the queue iterator so the gap between two jobs handed out is one job's decision time."""
    original = passes.FairQueue.take

    def take(self, limit):
        for job in original(self, limit):
            stamps.append(time.perf_counter())
            yield job
        stamps.append(time.perf_counter())

    return take


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policy", default="trainmaster")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    rng, now = random.Random(args.seed), 1_000_000.0
    nodes, running = fleet(rng, args.nodes, now)
    usage = {f"user{u}": rng.uniform(0, 50) for u in range(200)}
    state = ClusterState(
        nodes=tuple(nodes),
        queue=tuple(queue(rng, args.jobs, now)),
        running=tuple(running),
        catalogue=DEFAULT_CATALOGUE,
        usage_by_user=usage,
    )
    config = PolicyConfig(policy=args.policy, max_jobs_per_pass=args.jobs)
    index_s, pass_s, decisions, gaps = [], [], [], []
    passes.FairQueue.take = timed_take(stamps := [])
    for _ in range(args.repeats):
        stamps.clear()
        started = time.perf_counter()
        CapacityIndex(state, now=now, kinds=ALL_KINDS)
        index_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        decisions = schedule(state, now, config)
        pass_s.append(time.perf_counter() - started)
        gaps += [1000 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
    per_job_ms = [1000 * s / args.jobs for s in pass_s]
    kinds = {}
    for d in decisions:
        kinds[type(d).__name__] = kinds.get(type(d).__name__, 0) + 1
    print(f"policy {args.policy}: {args.nodes:,} nodes, {args.jobs:,} queued jobs, {len(running):,} running jobs")
    print(f"index build      median {1000 * statistics.median(index_s):8.1f} ms")
    print(f"full pass        median {1000 * statistics.median(pass_s):8.1f} ms  (all {args.jobs:,} jobs examined)")
    print(f"per job, mean    median {statistics.median(per_job_ms):8.3f} ms  (pass time / jobs, index build included)")
    if gaps:
        gaps.sort()
        print(
            f"per job decision median {statistics.median(gaps):8.3f} ms  p99 {gaps[int(0.99 * len(gaps))]:.3f} ms"
            f"  max {gaps[-1]:.3f} ms  (goal: median < 1 ms)"
        )
    print(f"decisions        {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
