"""The four placement policies side by side on one trace, with the goals checked.

Usage: PYTHONPATH=. python bench/sched/compare.py --pods PODS.csv --nodes NODES.csv [--local N --reserved M]
"""

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor

from services.placement.policy import POLICIES
from services.placement.sim.cli import parser as sim_parser, simulate

ORDER = ("trainmaster", "burst", "burst-after", "local-fifo", "wait-local")
ROWS = (
    ("avg_jct_s", "avg JCT (s)"),
    ("p99_jct_s", "p99 JCT (s)"),
    ("avg_jct_time_sensitive_s", "avg JCT time-sensitive (s)"),
    ("avg_jct_cost_sensitive_s", "avg JCT cost-sensitive (s)"),
    ("makespan_s", "makespan (s)"),
    ("on_demand_node_hours", "on-demand node-hours"),
    ("on_demand_dollars", "on-demand dollars"),
    ("on_demand_nodes_created", "on-demand nodes created"),
    ("owned_utilisation", "owned GPU utilisation"),
    ("deadline_misses", "deadline misses (incl. unfinished)"),
    ("unfinished", "unfinished (unplaceable)"),
    ("pullbacks", "pull-backs"),
    ("policy_ms_per_pass", "policy ms per pass"),
    ("wall_s", "simulation wall time (s)"),
)


def _run(argv: list[str]) -> dict:
    return simulate(sim_parser().parse_args(argv))


def goals(results: dict[str, dict]) -> list[tuple[str, bool, str]]:
    tm, burst, fifo = results["trainmaster"], results["burst"], results["local-fifo"]
    saved = 1 - tm["on_demand_dollars"] / burst["on_demand_dollars"] if burst["on_demand_dollars"] else 0.0
    jct = tm["avg_jct_s"] / burst["avg_jct_s"] - 1
    ts = 1 - tm["avg_jct_time_sensitive_s"] / fifo["avg_jct_time_sensitive_s"]
    return [
        ("on-demand dollars vs burst: >= 50% fewer", saved >= 0.5, f"{saved:.1%} fewer"),
        ("avg JCT vs burst: within +5%", jct <= 0.05, f"{jct:+.1%}"),
        ("time-sensitive avg JCT vs local-fifo: >= 30% shorter", ts >= 0.3, f"{ts:.1%} shorter"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", required=True)
    p.add_argument("--nodes", required=True)
    p.add_argument("--local", type=int, default=None)
    p.add_argument("--reserved", type=int, default=None)
    p.add_argument("--estimate-error", type=float, default=0.0, help="log-normal sigma on expected durations")
    p.add_argument("--exchange-rate", type=float, default=None, help="see PolicyConfig.exchange_rate")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    common = ["--pods", args.pods, "--nodes", args.nodes]
    common += ["--local", str(args.local)] if args.local is not None else []
    common += ["--reserved", str(args.reserved)] if args.reserved is not None else []
    common += ["--estimate-error", str(args.estimate_error)]
    common += ["--exchange-rate", str(args.exchange_rate)] if args.exchange_rate is not None else []
    assert set(ORDER) == set(POLICIES)
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, 2))) as pool:
        runs = list(pool.map(_run, [common + ["--policy", name] for name in ORDER]))
    results = dict(zip(ORDER, runs, strict=True))
    checks = goals(results)
    if args.json:
        json.dump({"results": results, "goals": [dict(goal=g, met=m, value=v) for g, m, v in checks]}, sys.stdout)
        print()
        return 0
    first = results[ORDER[0]]
    owned = f"{first['local_nodes']} local + {first['reserved_nodes']} reserved nodes"
    print(f"trace: {first['jobs']} GPU jobs; owned: {owned}; estimate error sigma {args.estimate_error}")
    print(f"{'':36}" + "".join(f"{name:>14}" for name in ORDER))
    for key, label in ROWS:
        print(f"{label:36}" + "".join(f"{results[name][key]:>14,}" for name in ORDER))
    for goal, met, value in checks:
        print(f"{'MET ' if met else 'MISS'} {goal}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
