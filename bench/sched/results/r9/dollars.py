"""Round 9, item 1: where the on-demand dollars go on the tuning cells, trainmaster against burst, from the JSON of
`groups.py --dollars --json` (`dollars.sh`). Prints markdown: per cell the floor (jobs no owned node the job may use
could host), the rest and the idle rentals; then, over the cells, the dollars above the floor by class.

Usage: python bench/sched/results/r9/dollars.py [TAG]   (TAG r8: round 8's code, the default)
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).parent
CELLS = [(v, s) for s in ("8-4", "16-8") for v in ("default", "gpushare40", "gpuspec10", "cpu050")]
DIMS = {"allowed": 1, "priority": 2, "gpus": 3, "runs": 4}


def load(tag: str, policy: str, variant: str, size: str) -> dict | None:
    path = HERE / f"dollars-{tag}-{policy}-{variant}-{size}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main(tag: str = "r8") -> None:
    rows: dict[str, list] = {"trainmaster": [], "burst": []}
    print("| cell | burst $ (floor, rest, idle) | trainmaster $ (floor, rest, idle) | trainmaster / burst", end="")
    print(" | floor / burst |")
    print("|---|---|---|---:|---:|")
    sums = defaultdict(float)
    for variant, size in CELLS:
        got = {p: load(tag, p, variant, size) for p in rows}
        if None in got.values():
            continue
        parts = {}
        for policy, d in got.items():
            rows[policy] += d["groups"]
            floor = sum(r[-1] for r in d["groups"] if r[0] == "floor")
            rest = d["total"] - floor - d["idle"]
            parts[policy] = (d["total"], floor, rest, d["idle"])
            for name, value in zip(("total", "floor", "rest", "idle"), parts[policy], strict=True):
                sums[policy, name] += value
        b, t = parts["burst"], parts["trainmaster"]
        print(
            f"| `{variant}` {size.replace('-', '+')} | {b[0]:,.0f} ({b[1]:,.0f}, {b[2]:,.0f}, {b[3]:,.0f}) "
            f"| {t[0]:,.0f} ({t[1]:,.0f}, {t[2]:,.0f}, {t[3]:,.0f}) | {t[0] / b[0]:.3f}x | {b[1] / b[0]:.3f}x |"
        )
    b = [sums["burst", n] for n in ("total", "floor", "rest", "idle")]
    t = [sums["trainmaster", n] for n in ("total", "floor", "rest", "idle")]
    if b[0]:
        print(
            f"| **all** | {b[0]:,.0f} ({b[1]:,.0f}, {b[2]:,.0f}, {b[3]:,.0f}) | {t[0]:,.0f} ({t[1]:,.0f}, {t[2]:,.0f}, "
            f"{t[3]:,.0f}) | {t[0] / b[0]:.3f}x | {b[1] / b[0]:.3f}x |"
        )
    if b[0]:
        print(
            f"\nAt 0.55x burst's the cells would spend ${0.55 * b[0]:,.0f}; the floor is ${b[1]:,.0f} "
            f"({b[1] / b[0]:.3f}x), trainmaster spends ${t[0] - t[1]:,.0f} above it (${t[3]:,.0f} of it on idle or "
            f"booting nodes), burst ${b[0] - b[1]:,.0f}."
        )
    print()
    for dim, at in DIMS.items():
        table: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
        for slot, policy in ((0, "burst"), (2, "trainmaster")):
            for r in rows[policy]:
                if r[0] == "floor":
                    continue
                table[r[at]][slot] += r[-2]
                table[r[at]][slot + 1] += r[-1]
        print(f"| above the floor, by {dim} | burst jobs | burst $ | trainmaster jobs | trainmaster $ | difference |")
        print("|---|---:|---:|---:|---:|---:|")
        for key, (bj, bd, tj, td) in sorted(table.items(), key=lambda kv: -kv[1][3]):
            print(f"| {key} | {bj:,} | {bd:,.0f} | {tj:,} | {td:,.0f} | {td - bd:+,.0f} |")
        print()
    cross: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for slot, policy in ((0, "burst"), (2, "trainmaster")):
        for r in rows[policy]:
            if r[0] != "floor":
                cross[tuple(r[1:5])][slot] += r[-2]
                cross[tuple(r[1:5])][slot + 1] += r[-1]
    print("| class above the floor (allowed, priority, GPUs, runs) | burst jobs | burst $ | trainmaster jobs", end="")
    print(" | trainmaster $ | difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, (bj, bd, tj, td) in sorted(cross.items(), key=lambda kv: -kv[1][3])[:12]:
        print(f"| {', '.join(key)} | {bj:,} | {bd:,.0f} | {tj:,} | {td:,.0f} | {td - bd:+,.0f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
