"""Two replays of one cell job by job (`firststart.py`'s JSON lines): per group (allowed, priority, kind first
started on) jobs, wait to the first start and rented dollars in each; and the jobs whose first kind changed.
Usage: python bench/sched/results/r7/jobdiff.py BEFORE.jsonl[.gz] AFTER.jsonl[.gz]"""

import gzip
import json
import sys
from collections import defaultdict


def load(path: str) -> dict[str, dict]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def groups(rows: dict[str, dict]) -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in rows.values():
        g = out[(r["allowed"], r["priority"], r["first_kind"])]
        g[0] += 1
        g[1] += (r["first"] - r["submitted"]) / 3600
        g[2] += r["rented"]
    return out


def main(before_path: str, after_path: str) -> None:
    before, after = load(before_path), load(after_path)
    b, a = groups(before), groups(after)
    print(f"{'allowed':8} {'priority':8} {'first on':10} {'jobs':>11} {'wait h to first start':>22} {'rented $':>16}")
    for key in sorted(set(b) | set(a)):
        x, y = b.get(key, [0, 0.0, 0.0]), a.get(key, [0, 0.0, 0.0])
        print(
            f"{key[0]:8} {key[1]:8} {key[2]:10} {x[0]:>5} {y[0]:>5} {x[1]:>10,.0f} {y[1]:>10,.0f}"
            f" {x[2]:>7,.0f} {y[2]:>8,.0f}"
        )
    moved = [(i, before[i]["first_kind"], after[i]["first_kind"]) for i in before if i in after]
    changed = defaultdict(int)
    for _, k0, k1 in moved:
        if k0 != k1:
            changed[(k0, k1)] += 1
    print("first kind before -> after:", dict(changed))
    for label, rows in (("before", before), ("after", after)):
        again = [r for r in rows.values() if r["first_kind"] != r["last_kind"]]
        print(f"{label}: {len(again)} jobs moved after their first start")
    total = lambda rows: sum((r["finished"] - r["submitted"]) for r in rows.values()) / len(rows)  # noqa: E731
    print(f"average completion s: {total(before):,.0f} -> {total(after):,.0f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
