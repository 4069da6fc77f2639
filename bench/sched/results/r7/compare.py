"""Round 7 against round 6, sigma 0, trainmaster: per cell and per split (held out; the three misses studied job by
job in rounds 5-6 apart; tuned on). Usage: PYTHONPATH=. python bench/sched/results/r7/compare.py"""

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
}


def load(path: Path, policy: str) -> dict[tuple[str, str], dict]:
    out = {}
    for line in path.open():
        key, result = json.loads(line)
        p, variant, local, reserved, sigma = key.split("|")[:5]
        if p == policy and float(sigma) == 0.0:
            out[(variant, f"{local}+{reserved}")] = result
    return out


def figures(run: dict, burst: dict) -> tuple[float, float, float, bool]:
    """Dollars, their ratio to burst's, completion ratio, whether the cell holds (sigma 0: 1.05x)."""
    d, b = run["on_demand_dollars"], burst["on_demand_dollars"]
    ratio = d / b if b else (1.0 if d == 0 else float("inf"))
    jct = run["avg_jct_s"] / burst["avg_jct_s"]
    return d, ratio, jct, d <= b + 0.005 and jct <= 1.05


def split_of(cell: tuple[str, str]) -> str:
    size = tuple(int(n) for n in cell[1].split("+"))
    if cell[0] in TUNING_VARIANTS and size in TUNING_SIZES:
        return "tuned on"
    return "studied miss" if cell in MISSES else "held out"


def main() -> None:
    burst = load(HERE / "burst-rekeyed.jsonl", "burst")
    r6 = load(HERE.parent / "runs-r6.jsonl", "trainmaster")
    r7 = load(HERE / "runs-r7.jsonl", "trainmaster")
    rows = [(split_of(c), c, burst[c], r6.get(c), r7[c]) for c in sorted(r7)]
    print("| split | cell | burst $ | round 6 $ (ratio, completion) | round 7 $ (ratio, completion) | holds 6 -> 7 |")
    print("|---|---|---:|---:|---:|---|")
    for split, cell, b, old, new in sorted(rows, key=lambda r: (r[0] != "held out", r[0], r[1][1], r[1][0])):
        o, n = figures(old, b), figures(new, b)
        print(
            f"| {split} | `{cell[0]}` {cell[1]} | {b['on_demand_dollars']:,.0f}"
            f" | {o[0]:,.0f} ({o[1]:.3f}x, {o[2]:.3f}x)"
            f" | {n[0]:,.0f} ({n[1]:.3f}x, {n[2]:.3f}x) | {'yes' if o[3] else 'NO'} -> {'yes' if n[3] else 'NO'} |"
        )
    print()
    print("| split | cells | hold round 7 (round 6) | round 7 $ / burst $ | ratio (round 6) | max completion (r6) |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, splits in SPLITS.items():
        sel = [r for r in rows if r[0] in splits]
        if not sel:
            continue
        old = [figures(r[3], r[2]) for r in sel]
        new = [figures(r[4], r[2]) for r in sel]
        bd = sum(r[2]["on_demand_dollars"] for r in sel)
        print(
            f"| {label} | {len(sel)} | {sum(n[3] for n in new)} ({sum(o[3] for o in old)}) |"
            f" {sum(n[0] for n in new):,.0f} / {bd:,.0f} | {sum(n[0] for n in new) / bd:.3f}"
            f" ({sum(o[0] for o in old) / bd:.3f}) | {max(n[2] for n in new):.3f}x ({max(o[2] for o in old):.3f}x) |"
        )


if __name__ == "__main__":
    main()
