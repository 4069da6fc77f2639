"""One cell's jobs by group: wait and run hours per (allowed, priority, the kind each job last started on), how the
misses in README.md are explained job by job.

Usage: PYTHONPATH=. python bench/sched/groups.py --pods ../shared/data/alibaba-gpu-v2023/openb_pod_list_gpuspec10.csv \
    --nodes ../shared/data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv --local 8 --reserved 4 [--estimate-error 0.3]
"""

import sys
from collections import defaultdict

from services.placement.policy import PolicyConfig, Start
from services.placement.sim.catalogue import DEFAULT_CATALOGUE, REFERENCE_TFLOPS
from services.placement.sim.cli import parser
from services.placement.sim.engine import Simulation
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes


class Recorded(Simulation):
    """The replay, remembering the kind of node each job last started on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind_of: dict[str, str] = {}

    def _start(self, d: Start, now: float) -> None:
        self.kind_of[d.job_id] = self.nodes[d.node_ids[0]].kind
        super()._start(d, now)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    jobs, _ = load_jobs(args.pods, TraceOptions(estimate_error=args.estimate_error))
    nodes = load_nodes(args.nodes, local=args.local, reserved=args.reserved)
    config = PolicyConfig(policy=args.policy, reference_tflops=REFERENCE_TFLOPS, exchange_rate=args.exchange_rate)
    sim = Recorded(jobs, nodes, catalogue=DEFAULT_CATALOGUE, config=config)
    out = sim.run()
    groups: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for j in jobs:
        r = j.request
        if r.id not in out.finished:
            continue
        g = groups[(r.allowed, r.priority, sim.kind_of.get(r.id, "-"))]
        g[0] += 1
        g[1] += (out.started[r.id] - r.submitted_at) / 3600
        g[2] += (out.finished[r.id] - out.started[r.id]) / 3600
    print(f"{'allowed':8} {'priority':8} {'ran on':10} {'jobs':>6} {'wait h':>10} {'run h':>10}")
    for (allowed, priority, kind), (n, wait, run) in sorted(groups.items()):
        print(f"{allowed:8} {priority:8} {kind:10} {n:>6} {wait:>10,.0f} {run:>10,.0f}")
    print(f"moves to make room {out.moves_to_make_room}, pull-backs {out.pullbacks}, on-demand ${out.od_dollars:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
