"""One cell with `owned_wait_order` on against off, job by job: local-only jobs' mean waits and summed completion
difference by expected length (hours), per priority, and the local GPU-hours held by jobs that could rent (how round
13 read the 8+4 completion losses).
Usage: PYTHONPATH=. python bench/sched/results/r13/lengths.py --pods ... --nodes ... --local 8 --reserved 4"""

import sys
from collections import defaultdict

from bench.sched import jobs
from services.placement.sim.cli import parser

EDGES = [0, 1, 5, 10, 20, 50, 100]  # lower bounds of the length buckets, hours


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    res = {}
    for setting in ("on", "off"):
        ran, total, trace = jobs.replay(args, "trainmaster", owned_wait_order=setting)
        res[setting] = ran
        print(setting, f"${total:,.0f}", flush=True)
    req = {j.request.id: j.request for j in trace}
    both = [i for i in res["on"] if i in res["off"]]
    for prio in ("time", "cost"):
        print(f"\nlocal/{prio}: length bucket h, jobs, mean wait on, off, sum completion diff h")
        buckets: dict[float, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for i in both:
            r = req[i]
            if r.allowed != "local" or r.priority != prio:
                continue
            g = buckets[max(e for e in EDGES if e <= r.expected_duration_s / 3600)]
            on, off = res["on"][i], res["off"][i]
            g[0] += 1
            g[1] += on.wait_s / 3600
            g[2] += off.wait_s / 3600
            g[3] += (on.completion_s - off.completion_s) / 3600
        for k in sorted(buckets):
            n, won, woff, dc = buckets[k]
            print(f"  >={k:>5}: {n:5.0f} {won / n:8.1f} {woff / n:8.1f} {dc:+10.1f}")
    for setting in ("on", "off"):
        held = sum(
            (r.completion_s - r.wait_s) / 3600 * req[i].gpu_count
            for i, r in res[setting].items()
            if r.kind == "local" and req[i].allowed != "local"
        )
        print(setting, f"GPU-h of jobs that could rent, last started on local: {held:,.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
