"""One cell, two policies, job by job: which jobs cost more or finish later under the first than under the second
(`burst` by default), grouped by class, and the jobs that make most of the difference with where each ran. How the
misses in README.md (round 11 on) are explained job by job.

Usage: PYTHONPATH=. python bench/sched/jobs.py --pods ../shared/data/alibaba-gpu-v2023/openb_pod_list_gpuspec05.csv \
    --nodes ../shared/data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv --local 22 --reserved 12 \
    [--against burst] [--against-owned-wait-order on|off] [--top 15]

A job's completion is its finish less its submission; its dollars are the on-demand dollars of the stretches it ran
on rented nodes (`groups.Recorded`); what no job ran on (booting, idle before release) is a line of its own. The
class is (allowed, priority, GPUs per rank, GPU models asked for, where it first started under each policy).
"""

import dataclasses
import sys
from collections import defaultdict
from dataclasses import dataclass

from bench.sched.groups import Recorded
from services.placement.sim.catalogue import DEFAULT_CATALOGUE
from services.placement.sim.cli import parser, policy_config
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes


@dataclass(frozen=True, slots=True)
class Ran:
    """One job under one policy: when it finished, where it first started, after how long, and its rented dollars."""

    completion_s: float
    wait_s: float
    kind: str
    dollars: float


def replay(args, policy: str, *, owned_wait_order: str | None = None) -> tuple[dict[str, Ran], float, list]:
    """Every finished job's `Ran` under `policy` at the command line's settings (`owned_wait_order` "on"/"off" in place
    of its own), the cell's on-demand dollars, and the trace's jobs."""
    jobs, _ = load_jobs(args.pods, TraceOptions(estimate_error=args.estimate_error))
    nodes = load_nodes(args.nodes, local=args.local, reserved=args.reserved)
    config = policy_config(args, policy=policy)
    if owned_wait_order is not None:
        config = dataclasses.replace(config, owned_wait_order=owned_wait_order == "on")
    sim = Recorded(jobs, nodes, catalogue=DEFAULT_CATALOGUE, config=config)
    out = sim.run()
    ran = {}
    for j in jobs:
        r = j.request
        if r.id in out.finished:
            first = sim.first_started.get(r.id, out.started[r.id])
            ran[r.id] = Ran(
                completion_s=out.finished[r.id] - r.submitted_at,
                wait_s=first - r.submitted_at,
                kind=sim.kind_of.get(r.id, "-"),
                dollars=sim.rented.get(r.id, 0.0),
            )
    return ran, out.od_dollars, jobs


def job_class(request, mine: Ran, theirs: Ran) -> tuple:
    models = ",".join(sorted(request.gpu_models)) or "any"
    gpus = str(request.gpu_count) if request.gpu_count < 3 else "3+"
    return (request.allowed, request.priority, gpus, models, f"{mine.kind}/{theirs.kind}")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    p.add_argument("--against", default="burst", help="the policy each job is set against")
    p.add_argument(
        "--against-owned-wait-order", choices=("on", "off"), default=None, help="the second policy's setting"
    )
    p.add_argument("--top", type=int, default=15, help="jobs listed by dollars and by completion")
    args = p.parse_args(argv)
    mine, my_total, jobs = replay(args, args.policy)
    theirs, their_total, _ = replay(args, args.against, owned_wait_order=args.against_owned_wait_order)
    requests = {j.request.id: j.request for j in jobs}
    both = [i for i in mine if i in theirs]
    n = len(both)
    groups: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for i in both:
        g = groups[job_class(requests[i], mine[i], theirs[i])]
        g[0] += 1
        g[1] += mine[i].dollars - theirs[i].dollars
        g[2] += (mine[i].completion_s - theirs[i].completion_s) / 3600
    print(f"{args.policy} ${my_total:,.2f} against {args.against} ${their_total:,.2f}; {n} jobs finished under both")
    idle = (my_total - sum(r.dollars for r in mine.values())) - (their_total - sum(r.dollars for r in theirs.values()))
    print(f"no job on it (booting, idle before release): {idle:+,.2f} $")
    jct = sum(mine[i].completion_s - theirs[i].completion_s for i in both) / max(n, 1) / 3600
    ratio = sum(mine[i].completion_s for i in both) / max(sum(theirs[i].completion_s for i in both), 1e-9)
    print(f"average completion {jct:+.3f} h per job ({ratio:.3f}x)")
    print(f"{'allowed':7} {'priority':8} {'gpus':4} {'models':12} {'first ran':20} {'jobs':>6} {'$':>10} {'job-h':>10}")
    for (allowed, priority, gpus, models, kinds), (count, dollars, hours) in sorted(
        groups.items(), key=lambda g: -abs(g[1][1]) - abs(g[1][2])
    ):
        if abs(dollars) >= 0.01 or abs(hours) >= 0.01:
            print(
                f"{allowed:7} {priority:8} {gpus:4} {models:12} {kinds:20} {count:>6}"
                f" {dollars:>+10,.2f} {hours:>+10,.1f}"
            )
    for title, key in (
        ("dollars", lambda i: mine[i].dollars - theirs[i].dollars),
        ("completion h", lambda i: (mine[i].completion_s - theirs[i].completion_s) / 3600),
    ):
        print(f"\nthe {args.top} jobs with the largest difference in {title} ({args.policy} less {args.against})")
        for i in sorted(both, key=lambda i: -abs(key(i)))[: args.top]:
            r, a, b = requests[i], mine[i], theirs[i]
            print(
                f"{i} {r.allowed}/{r.priority} {r.gpu_count}x{','.join(sorted(r.gpu_models)) or 'any'} "
                f"{key(i):+,.2f}: ran on {a.kind} after {a.wait_s / 3600:,.1f} h (${a.dollars:,.2f}, "
                f"{a.completion_s / 3600:,.1f} h) against {b.kind} after {b.wait_s / 3600:,.1f} h "
                f"(${b.dollars:,.2f}, {b.completion_s / 3600:,.1f} h)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
