"""Round 8's tuning runs side by side: per setting (the run version: code digest and arguments), each tuning cell's
trainmaster dollars and completion against burst's of the same version, the cells that hold and the totals.
Usage: PYTHONPATH=. python bench/sched/results/r8/tuning.py [bench/sched/results/r8/tuning.jsonl]"""

import json
import sys
from collections import defaultdict


def main(path: str = "bench/sched/results/r8/tuning.jsonl") -> None:
    runs: dict[str, dict[tuple, dict]] = defaultdict(dict)
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        key, result = json.loads(line)
        policy, variant, local, reserved, sigma, version = key.split("|")
        runs[version][(policy, variant, f"{local}+{reserved}")] = result
    for version, got in runs.items():
        cells = sorted({(v, s) for p, v, s in got if p == "trainmaster" and ("burst", v, s) in got})
        print(f"\n{version}")
        held = tm_total = burst_total = 0.0
        worst = 0.0
        for variant, size in cells:
            tm, burst = got[("trainmaster", variant, size)], got[("burst", variant, size)]
            d, b = tm["on_demand_dollars"], burst["on_demand_dollars"]
            jct = tm["avg_jct_s"] / burst["avg_jct_s"]
            ok = d <= b + 0.005 and jct <= 1.05
            held += ok
            tm_total += d
            burst_total += b
            worst = max(worst, jct)
            print(
                f"  {variant:11} {size:5} ${d:>9,.0f} / ${b:>9,.0f} = {d / b if b else 1:.3f}x  completion {jct:.3f}x"
                f"  {'holds' if ok else 'MISS'}"
            )
        if cells:
            print(
                f"  {int(held)}/{len(cells)} hold; ${tm_total:,.0f} / ${burst_total:,.0f} = "
                f"{tm_total / burst_total:.3f}x; max completion {worst:.3f}x"
            )


if __name__ == "__main__":
    main(*sys.argv[1:2])
