"""One cell's jobs by group: wait hours (submission to first start) and hours from first start to end per (allowed,
priority, the kind each job last started on), how the
misses in README.md are explained job by job; with `--dollars`, where the on-demand dollars go.

Usage: PYTHONPATH=. python bench/sched/groups.py --pods ../shared/data/alibaba-gpu-v2023/openb_pod_list_gpuspec10.csv \
    --nodes ../shared/data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv --local 8 --reserved 4 \
    [--estimate-error 0.3] [--dollars]

`--dollars`: each stretch a job ran on an on-demand node is charged its GPUs' share of the node's price, by group:
whether any owned node the job may use could ever host it (no: the floor, what every policy rents), the job's
allowed kinds and priority, its GPUs per rank (1, 2, 3+), and how long it runs (an hour or less: no checkpoint, never
on spot); what no job ran on (booting, idle before release) is a line of its own. With `--json`, one JSON object
(`groups`: [hostable, allowed, priority, gpus, length, jobs, dollars]; `idle`; `total`) for
`results/r9/dollars.py`, which sets policies and cells side by side.
"""

import json
import sys
from collections import defaultdict

from shared.pricing import rank_price_per_hour
from services.placement.policy import PolicyConfig, Start
from services.placement.policy.hosting import could_host
from services.placement.policy.models import OWNED_KINDS
from services.placement.sim.catalogue import DEFAULT_CATALOGUE, REFERENCE_TFLOPS
from services.placement.sim.cli import parser
from services.placement.sim.engine import Simulation
from services.placement.sim.trace import TraceOptions, load_jobs, load_nodes


class Recorded(Simulation):
    """The replay, remembering the kind of node each job last started on and its on-demand dollars."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kind_of: dict[str, str] = {}
        self.first_started: dict[str, float] = {}  # a job's later starts (moved, pulled back) are not waiting
        self.rented: dict[str, float] = defaultdict(float)  # job id -> on-demand dollars of the stretches it ran

    def _start(self, d: Start, now: float) -> None:
        self.kind_of[d.job_id] = self.nodes[d.node_ids[0]].kind
        self.first_started.setdefault(d.job_id, now)
        super()._start(d, now)

    def _stop(self, job_id: str, now: float, *, kept_s: float | None = None) -> None:
        seg = self.segments[job_id]
        for node_id, idx in zip(seg.node_ids, seg.indices, strict=True):
            node = self.nodes[node_id]
            if node.kind == "on_demand":
                hourly = rank_price_per_hour(node.price_per_hour, gpus=len(idx), node_gpus=node.gpu_count)
                self.rented[job_id] += (now - seg.start) / 3600 * hourly
        super()._stop(job_id, now, kept_s=kept_s)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    p.add_argument("--dollars", action="store_true", help="on-demand dollars by job group")
    args = p.parse_args(argv)
    jobs, _ = load_jobs(args.pods, TraceOptions(estimate_error=args.estimate_error))
    nodes = load_nodes(args.nodes, local=args.local, reserved=args.reserved)
    config = PolicyConfig(policy=args.policy, reference_tflops=REFERENCE_TFLOPS, exchange_rate=args.exchange_rate)
    sim = Recorded(jobs, nodes, catalogue=DEFAULT_CATALOGUE, config=config)
    out = sim.run()
    if args.dollars:
        owned = [n for n in nodes if n.kind in OWNED_KINDS]
        _dollars(jobs, owned, sim.rented, out.od_dollars, as_json=args.json)
        return 0
    groups: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for j in jobs:
        r = j.request
        if r.id not in out.finished:
            continue
        g = groups[(r.allowed, r.priority, sim.kind_of.get(r.id, "-"))]
        g[0] += 1
        first = sim.first_started.get(r.id, out.started[r.id])
        g[1] += (first - r.submitted_at) / 3600  # counted to the last start, a move's months ran as "waiting"
        g[2] += (out.finished[r.id] - first) / 3600
    print(f"{'allowed':8} {'priority':8} {'ran on':10} {'jobs':>6} {'wait h':>10} {'run h':>10}")
    for (allowed, priority, kind), (n, wait, run) in sorted(groups.items()):
        print(f"{allowed:8} {priority:8} {kind:10} {n:>6} {wait:>10,.0f} {run:>10,.0f}")
    print(f"moves to make room {out.moves_to_make_room}, pull-backs {out.pullbacks}, on-demand ${out.od_dollars:,.0f}")
    return 0


def _dollars(jobs, owned, rented: dict[str, float], total: float, *, as_json: bool = False) -> None:
    groups: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0])
    for j in jobs:
        r = j.request
        if rented.get(r.id, 0.0) <= 0:
            continue
        hostable = "owned can" if any(could_host(n, r) for n in owned) else "floor"
        length = "<=1h" if j.run_time_s <= 3600 else ("<=24h" if j.run_time_s <= 86400 else ">24h")
        gpus = str(r.gpu_count) if r.gpu_count < 3 else "3+"
        g = groups[(hostable, r.allowed, r.priority, gpus, length)]
        g[0] += 1
        g[1] += rented[r.id]
    idle = total - sum(rented.values())
    if as_json:
        rows = [[*key, n, round(dollars, 2)] for key, (n, dollars) in sorted(groups.items())]
        print(json.dumps({"groups": rows, "idle": round(idle, 2), "total": round(total, 2)}))
        return
    print(f"{'owned host':10} {'allowed':8} {'priority':8} {'gpus':4} {'runs':6} {'jobs':>6} {'dollars':>10}")
    for (hostable, allowed, priority, gpus, length), (n, dollars) in sorted(groups.items(), key=lambda g: -g[1][1]):
        print(f"{hostable:10} {allowed:8} {priority:8} {gpus:4} {length:6} {n:>6} {dollars:>10,.0f}")
    print(f"no job on it (booting, idle before release): ${idle:,.0f}; on-demand ${total:,.0f} in all")


if __name__ == "__main__":
    sys.exit(main())
