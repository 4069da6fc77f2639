"""`make bench-search`: replay the recorded sweep and MLPerf groups through none, median, hyperband and predicted.

Pruner settings of `predicted` are chosen on the tuning searches (even sweep chunks, MLPerf v3.1) and the headline
is the held-out ones (odd sweep chunks, MLPerf v4.0).

    .venv/bin/python -m bench.search [--tune] [--orders 3] [--out bench/search/results.json]
"""

import argparse
import itertools
import json
import random
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.search.groups import Group, mlperf_groups, sweep_groups
from bench.search.replay import Outcome, simulate
from services.submitter.searches.pruners import Config

PRUNERS = ("none", "median", "hyperband", "predicted")
MLPERF = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mlperf"
GRID = {"z": (2.0,), "reach": (0.25, 0.5), "history": (0.5, 0.75), "margin": (0.0, 0.001, 0.002)}
HYPERBAND_GRID = {"hb_min_fraction": (1 / 81, 1 / 27, 1 / 9)}


def run(groups: list[Group], pruner: str, *, config: Config, orders: int, parallelism: int) -> list[Outcome]:
    outcomes = []
    for group in groups:
        for order in range(orders):
            curves = list(group.curves)
            random.Random(f"{group.name}:{order}").shuffle(curves)
            outcomes.append(
                simulate(curves, pruner, parallelism=parallelism, config=config, key=f"{group.name}:{order}")
            )
    return outcomes


def summary(outcomes: list[Outcome], baseline: list[Outcome]) -> dict:
    spent, full = sum(o.gpu_s for o in outcomes), sum(o.gpu_s for o in baseline)
    return {
        "gpu_hours": spent / 3600,
        "saved_pct": 100 * (1 - spent / full) if full else 0.0,
        "best_stopped_pct": 100 * sum(o.best_stopped for o in outcomes) / max(1, len(outcomes)),
        "searches": len(outcomes),
        "pruned": sum(o.pruned for o in outcomes),
        "mean_regret": sum(o.regret for o in outcomes) / max(1, len(outcomes)),
    }


def tune(sets: dict[str, list[Group]], *, orders: int, parallelism: int) -> tuple[Config, list[dict]]:
    """Hyperband's min_resource that stops the best trial least often (then saves most) on the tuning searches;
    then the predicted setting saving most among those that stop the best no more often than that hyperband.
    Savings are averaged over the sources (hours would let MLPerf's accelerator-hours drown the sweep's)."""
    bases = {
        name: run(groups, "none", config=Config(), orders=orders, parallelism=parallelism)
        for name, groups in sets.items()
    }
    tried, chosen = [], Config()

    def score(pruner: str, config: Config) -> dict:
        parts = [
            summary(run(groups, pruner, config=config, orders=orders, parallelism=parallelism), bases[name])
            for name, groups in sets.items()
        ]
        searches = sum(p["searches"] for p in parts)
        return {
            "saved_pct": sum(p["saved_pct"] for p in parts) / len(parts),
            "best_stopped_pct": sum(p["best_stopped_pct"] * p["searches"] for p in parts) / searches,
        }

    def pick(pruner: str, grid: dict, key) -> tuple[Config, dict]:
        best = None
        for values in itertools.product(*grid.values()):
            config = replace(chosen, **dict(zip(grid, values)))
            result = score(pruner, config)
            tried.append({"pruner": pruner, **dict(zip(grid, values)), **result})
            print(
                f"  tune {pruner} {dict(zip(grid, values))}: saved {result['saved_pct']:.1f}% (mean over sources) "
                f"best stopped {result['best_stopped_pct']:.1f}%",
                flush=True,
            )
            if best is None or key(result) > best[0]:
                best = (key(result), config, result)
        return best[1], best[2]

    chosen, bar = pick("hyperband", HYPERBAND_GRID, lambda s: (-s["best_stopped_pct"], s["saved_pct"]))
    chosen, _ = pick(
        "predicted",
        GRID,
        lambda s: (
            s["best_stopped_pct"] <= bar["best_stopped_pct"],
            s["saved_pct"] if s["best_stopped_pct"] <= bar["best_stopped_pct"] else -s["best_stopped_pct"],
        ),
    )
    return chosen, tried


def table(rows: list[dict]) -> str:
    lines = [
        f"{'searches':<26} {'pruner':<10} {'n':>4} {'hours':>10} {'saved %':>8} {'best stopped %':>15} "
        f"{'pruned':>7} {'regret':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['set']:<26} {r['pruner']:<10} {r['searches']:>4} {r['gpu_hours']:>10.3f} "
            f"{r['saved_pct']:>8.1f} {r['best_stopped_pct']:>15.1f} {r['pruned']:>7} {r['mean_regret']:>9.4f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=3, help="Trial orders replayed per search.")
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--tune", action="store_true", help="Choose predicted's settings on the tuning searches.")
    parser.add_argument("--cache", type=Path, default=Path(".trainmaster/cache/mlperf"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    began = time.monotonic()
    sets = {"sweep": sweep_groups(), "mlperf": mlperf_groups(sorted(MLPERF.glob("*.tar.gz")), cache_dir=args.cache)}
    config, tried = Config(), []
    if args.tune:
        tuning = {name: [g for g in groups if g.split == "tune"] for name, groups in sets.items()}
        config, tried = tune({k: v for k, v in tuning.items() if v}, orders=args.orders, parallelism=args.parallelism)
    rows = []
    for source, groups in sets.items():
        for split in ("tune", "test"):
            chosen = [g for g in groups if g.split == split]
            if not chosen:
                continue
            base = run(chosen, "none", config=config, orders=args.orders, parallelism=args.parallelism)
            for pruner in PRUNERS:
                outcomes = (
                    base
                    if pruner == "none"
                    else run(chosen, pruner, config=config, orders=args.orders, parallelism=args.parallelism)
                )
                rows.append(
                    {"set": f"{source}/{split} ({len(chosen)} groups)", "pruner": pruner, **summary(outcomes, base)}
                )
    print(f"settings (hyperband hb_*, predicted z/reach/min_progress): {asdict(config)}")
    print("hours: CPU-hours for the sweep (recorded wall time), accelerator-hours for MLPerf")
    print(table(rows))
    print(f"({time.monotonic() - began:.0f} s)")
    if args.out:
        args.out.write_text(json.dumps({"config": asdict(config), "rows": rows, "tuning": tried}, indent=1))


if __name__ == "__main__":
    main()
