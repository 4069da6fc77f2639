"""What the rounds' comparison scripts share (round 10 on): reading a matrix's runs, a cell's figures against burst's,
its split, and the per-cell and per-split tables of one round against the one before."""

import json
import sys
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix import TUNING_SIZES, TUNING_VARIANTS  # noqa: E402

Cell = tuple[str, str]  # (variant, "LOCAL+RESERVED")
SPLITS = {
    "held out (all)": ("held out", "studied miss"),
    "held out, not studied": ("held out",),
    "studied misses": ("studied miss",),
    "tuned on": ("tuned on",),
    "all": ("held out", "studied miss", "tuned on"),
}


def load(paths: Iterable[Path], policy: str, sigma: float) -> dict[Cell, dict]:
    """A policy's runs at one estimate error, per cell (a later file's run of a cell wins)."""
    out = {}
    for path in paths:
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


def split_of(cell: Cell, misses: set[Cell]) -> str:
    size = tuple(int(n) for n in cell[1].split("+"))
    if cell[0] in TUNING_VARIANTS and size in TUNING_SIZES:
        return "tuned on"
    return "studied miss" if cell in misses else "held out"


def print_tables(
    *,
    rows: list[tuple[str, Cell, dict, dict | None, dict]],
    names: tuple[str, str],
    marks: dict[Cell, str],
    limit: float,
) -> None:
    """Per cell, then per split: rows are (split, cell, burst, before or None, after); `marks` prefixes an after
    figure not run this round (e.g. '= ' for a cell counted at the round before's result)."""
    before_name, after_name = names
    print(
        f"| split | cell | burst $ | {before_name} $ (ratio, completion) | {after_name} $ (ratio, completion) | holds |"
    )
    print("|---|---|---:|---:|---:|---|")
    order = {"studied miss": 0, "held out": 1, "tuned on": 2}
    for split, cell, b, old, new in sorted(rows, key=lambda r: (order[r[0]], r[1][1], r[1][0])):
        n = figures(new, b, limit)
        o = figures(old, b, limit) if old else None
        before = f"{o[0]:,.0f} ({o[1]:.3f}x, {o[2]:.3f}x)" if o else "-"
        holds = f"{('yes' if o[3] else 'NO') if o else '-'} -> {'yes' if n[3] else 'NO'}"
        print(
            f"| {split} | `{cell[0]}` {cell[1]} | {b['on_demand_dollars']:,.0f} | {before}"
            f" | {marks.get(cell, '')}{n[0]:,.0f} ({n[1]:.3f}x, {n[2]:.3f}x) | {holds} |"
        )
    print()
    print(
        f"| split | cells | hold {after_name} ({before_name}) | {after_name} $ / burst $ | ratio ({before_name})"
        f" | max completion ({before_name}) |"
    )
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
