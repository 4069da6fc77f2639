"""Round 9 against round 8 (`r8/runs-r8.jsonl`), trainmaster: per cell and per split (held out, the three misses
studied apart, tuned on); a cell holds at 1.05x burst's completion at sigma 0, 1.08x at 0.3. Round 9 changed what
only jobs no instance type could host (and jobs that accept only some GPU models) see: the ten variants without such
a job (`UNCHANGED`, counted in README.md) decide alike by construction, so a cell of theirs this round did not run
counts round 8's result, marked `=`. Usage: PYTHONPATH=. python bench/sched/results/r9/compare.py [--sigma 0.3]"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from matrix import TUNING_SIZES, TUNING_VARIANTS  # noqa: E402

HERE = Path(__file__).parent
MISSES = {("cpu0", "12+6"), ("gpuspec20", "8+4"), ("gpuspec20", "12+6")}
SPLITS = {
    "held out (all)": ("held out", "studied miss"),
    "held out, not studied": ("held out",),
    "studied misses": ("studied miss",),
    "tuned on": ("tuned on",),
    "all": ("held out", "studied miss", "tuned on"),
}
ROUND8 = HERE.parent / "r8" / "runs-r8.jsonl"
BEFORE = {0.0: ("round 8", ROUND8), 0.3: ("round 8", ROUND8)}
UNCHANGED = {"cpu0", "cpu050", "cpu100", "cpu250", "cpu300", "default", "gpushare100", "gpushare20", "gpushare40"}
UNCHANGED |= {"gpushare80"}


def load(path: Path, policy: str, sigma: float) -> dict[tuple[str, str], dict]:
    out = {}
    with path.open() as f:
        for line in f:
            key, result = json.loads(line)
            p, variant, local, reserved, s = key.split("|")[:5]
            if p == policy and float(s) == sigma:
                out[(variant, f"{local}+{reserved}")] = result
    return out


def figures(run: dict, burst: dict, limit: float) -> tuple[float, float, float, bool]:
    """Dollars, their ratio to burst's, completion ratio, whether the cell holds."""
    d, b = run["on_demand_dollars"], burst["on_demand_dollars"]
    ratio = d / b if b else (1.0 if d == 0 else float("inf"))
    jct = run["avg_jct_s"] / burst["avg_jct_s"]
    return d, ratio, jct, d <= b + 0.005 and jct <= limit


def split_of(cell: tuple[str, str]) -> str:
    size = tuple(int(n) for n in cell[1].split("+"))
    if cell[0] in TUNING_VARIANTS and size in TUNING_SIZES:
        return "tuned on"
    return "studied miss" if cell in MISSES else "held out"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sigma", type=float, default=0.0)
    sigma = p.parse_args().sigma
    limit = 1.05 if sigma == 0 else 1.08
    name, path = BEFORE[sigma]
    burst = load(HERE / "burst-rekeyed.jsonl", "burst", 0.0)
    old_runs = load(path, "trainmaster", sigma)
    new_runs = {}
    for part in ("runs-r9.jsonl", "runs-r9-miss.jsonl"):  # the second: gpuspec20 8+4, run beside the stages
        if (HERE / part).exists():
            new_runs |= load(HERE / part, "trainmaster", sigma)
    filled = {c for c in old_runs if c not in new_runs and c[0] in UNCHANGED}
    new_runs |= {c: old_runs[c] for c in filled}
    rows = [(split_of(c), c, burst[c], old_runs.get(c), new_runs[c]) for c in sorted(new_runs)]
    print(f"| split | cell | burst $ | {name} $ (ratio, completion) | round 9 $ (ratio, completion) | holds |")
    print("|---|---|---:|---:|---:|---|")
    for split, cell, b, old, new in sorted(rows, key=lambda r: (r[0] != "held out", r[0], r[1][1], r[1][0])):
        n = figures(new, b, limit)
        o = figures(old, b, limit) if old else None
        before = f"{o[0]:,.0f} ({o[1]:.3f}x, {o[2]:.3f}x)" if o else "-"
        holds = f"{('yes' if o[3] else 'NO') if o else '-'} -> {'yes' if n[3] else 'NO'}"
        print(
            f"| {split} | `{cell[0]}` {cell[1]} | {b['on_demand_dollars']:,.0f} | {before}"
            f" | {'= ' if cell in filled else ''}{n[0]:,.0f} ({n[1]:.3f}x, {n[2]:.3f}x) | {holds} |"
        )
    print()
    print(f"{len(filled)} cells counted at round 8's result (`=`), {len(new_runs) - len(filled)} run this round")
    print()
    print(f"| split | cells | hold round 9 ({name}) | round 9 $ / burst $ | ratio ({name}) | max completion ({name}) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, splits in SPLITS.items():
        sel = [r for r in rows if r[0] in splits]
        if not sel:
            continue
        new = [figures(r[4], r[2], limit) for r in sel]
        old = [figures(r[3], r[2], limit) for r in sel if r[3]]
        bd = sum(r[2]["on_demand_dollars"] for r in sel)
        bo = sum(r[2]["on_demand_dollars"] for r in sel if r[3])
        before = (
            (f"{sum(o[3] for o in old)}", f"{sum(o[0] for o in old) / bo:.3f}", f"{max(o[2] for o in old):.3f}x")
            if old and bo
            else ("-", "-", "-")
        )
        print(
            f"| {label} | {len(sel)} | {sum(n[3] for n in new)} ({before[0]}) |"
            f" {sum(n[0] for n in new):,.0f} / {bd:,.0f} | {sum(n[0] for n in new) / bd:.3f} ({before[1]})"
            f" | {max(n[2] for n in new):.3f}x ({before[2]}) |"
        )


if __name__ == "__main__":
    main()
