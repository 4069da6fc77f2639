"""The placement policies on every workload variant x fleet size x estimate error, with the goals per cell.

Usage: PYTHONPATH=. python bench/sched/matrix.py --data ../shared/data/alibaba-gpu-v2023 [--quick] [--workers 2]
Cells already in `--cache` (JSON lines) are not run again, so an interrupted run resumes. Every run is keyed by the
code that produced it (`code_version`): a cached run of other policy or simulator code is never reused.
"""

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from services.placement.sim.cli import parser as sim_parser, simulate

SIZES = ((8, 4), (12, 6), (16, 8), (22, 12))
SIGMAS = (0.0, 0.3)
BASELINES = ("burst", "burst-after", "wait-local", "local-fifo")
# trainmaster with every instance type also offered on spot to the jobs that checkpoint (sim/spot.py)
SPOT = "trainmaster+spot"
SPOT_GOAL = 0.35  # total cloud dollars (on-demand + spot) against burst's, at completion within the cell's limit
# Tuned on these (variant, size) cells only; every other cell is held out.
TUNING_VARIANTS = ("default", "gpushare40", "gpuspec10", "cpu050")
TUNING_SIZES = ((8, 4), (16, 8))
MAX_WORKERS = 2  # the VM has two cores shared with everything else


def variants(data: Path) -> list[str]:
    return sorted(
        p.name.removeprefix("openb_pod_list_").removesuffix(".csv") for p in data.glob("openb_pod_list_*.csv")
    )


def runs(names: list[str], sizes, sigmas, policies=("trainmaster", SPOT, *BASELINES)) -> list[tuple]:
    """(policy, variant, local, reserved, sigma); baselines run at sigma 0 only (burst, burst-after and local-fifo
    never read a duration; wait-local is shown for reference)."""
    out = []
    for variant in names:
        for local, reserved in sizes:
            for policy in ("trainmaster", SPOT):
                if policy in policies:
                    out += [(policy, variant, local, reserved, sigma) for sigma in sigmas]
            out += [(policy, variant, local, reserved, 0.0) for policy in BASELINES if policy in policies]
    return out


ROOT = Path(__file__).resolve().parents[2]
# What a run's result depends on besides its inputs: the policies, the simulator and the shared rules they call.
CODE = ("services/placement/policy", "services/placement/sim", "shared/pricing.py", "shared/jobs.py")


def code_version(root: Path = ROOT) -> str:
    """A digest of every source file a run depends on (`CODE`): runs cached under another digest are not reused."""
    digest = hashlib.sha256()
    for part in CODE:
        path = root / part
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


DEFAULT_DATA = Path("../shared/data/alibaba-gpu-v2023")


def run_version(code: str, data: Path, extra: list[str]) -> str:
    """What a cached run was made with: the code's digest, and the data folder and simulator arguments where they
    are not the defaults (a run at another exchange rate, hazard scale or trace is never reused for this one)."""
    if data == DEFAULT_DATA and not extra:
        return code
    inputs = json.dumps([str(data.resolve()), extra]).encode()
    return f"{code}-{hashlib.sha256(inputs).hexdigest()[:8]}"


def _key(run: tuple) -> str:
    return "|".join(str(part) for part in run)


def load_runs(paths: list[Path], *, code: str) -> dict[str, dict]:
    """The cached runs of this code (`[key|code, result]` lines); lines of other code, or of none, are skipped."""
    results: dict[str, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            key, result = json.loads(line)
            run, _, version = key.rpartition("|")
            if version == code:
                results[run] = result
    return results


def _simulate(job: tuple) -> tuple[str, dict]:
    (policy, variant, local, reserved, sigma), data, extra = job
    spot = ["--spot"] if policy == SPOT else []
    argv = [
        "--pods",
        str(data / f"openb_pod_list_{variant}.csv"),
        "--nodes",
        str(data / "openb_node_list_gpu_node.csv"),
        "--policy",
        policy.removesuffix("+spot"),
        "--local",
        str(local),
        "--reserved",
        str(reserved),
        "--estimate-error",
        str(sigma),
        *spot,
        *extra,
    ]
    return _key((policy, variant, local, reserved, sigma)), simulate(sim_parser().parse_args(argv))


def cell(results: dict[str, dict], variant: str, local: int, reserved: int, sigma: float) -> dict | None:
    tm = results.get(_key(("trainmaster", variant, local, reserved, sigma)))
    burst = results.get(_key(("burst", variant, local, reserved, 0.0)))
    if tm is None or burst is None:
        return None
    dollars = (
        tm["on_demand_dollars"] / burst["on_demand_dollars"]
        if burst["on_demand_dollars"]
        else (1.0 if tm["on_demand_dollars"] == 0 else float("inf"))
    )
    jct = tm["avg_jct_s"] / burst["avg_jct_s"]
    limit = 1.05 if sigma == 0 else 1.08
    holds = tm["on_demand_dollars"] <= burst["on_demand_dollars"] + 0.005 and jct <= limit
    tuned = variant in TUNING_VARIANTS and (local, reserved) in TUNING_SIZES
    others = {p: results.get(_key((p, variant, local, reserved, 0.0))) for p in BASELINES[1:]}
    spot = results.get(_key((SPOT, variant, local, reserved, sigma)))
    return {
        "variant": variant,
        "size": f"{local}+{reserved}",
        "sigma": sigma,
        "tuned_on": tuned,
        "tm_dollars": tm["on_demand_dollars"],
        "burst_dollars": burst["on_demand_dollars"],
        "tm_jct_s": tm["avg_jct_s"],
        "burst_jct_s": burst["avg_jct_s"],
        "dollar_ratio": round(dollars, 3),
        "jct_ratio": round(jct, 3),
        "holds": holds,
        **{f"{p}_dollars": r["on_demand_dollars"] for p, r in others.items() if r},
        **{f"{p}_jct_s": r["avg_jct_s"] for p, r in others.items() if r},
        **(_spot_fields(spot, burst) if spot else {}),
    }


def _spot_fields(spot: dict, burst: dict) -> dict:
    """The spot column of a cell: cloud dollars (on-demand + spot) and completion against burst's."""
    dollars = spot.get("cloud_dollars", spot["on_demand_dollars"])
    return {
        "spot_dollars": dollars,
        "spot_jct_s": spot["avg_jct_s"],
        "spot_interruptions": spot["spot_interruptions"],
        "spot_jct_ratio": round(spot["avg_jct_s"] / burst["avg_jct_s"], 3),
        "spot_dollar_ratio": round(dollars / burst["on_demand_dollars"], 3)
        if burst["on_demand_dollars"]
        else (1.0 if dollars == 0 else float("inf")),
    }


def spot_summary(cells: list[dict], sigma: float, *, tuned: bool | None = None) -> dict:
    """The spot column over the chosen cells: total cloud dollars against burst's, completions within the limit."""
    chosen = [
        c for c in cells if c["sigma"] == sigma and (tuned is None or c["tuned_on"] == tuned) and "spot_dollars" in c
    ]
    if not chosen:
        return {}
    limit = 1.05 if sigma == 0 else 1.08
    spot, burst = sum(c["spot_dollars"] for c in chosen), sum(c["burst_dollars"] for c in chosen)
    ratio = round(spot / burst, 3) if burst else None
    within = sum(c["spot_jct_ratio"] <= limit for c in chosen)
    worst = max(chosen, key=lambda c: c["spot_jct_ratio"])
    return {
        "sigma": sigma,
        "cells": len(chosen),
        "spot_dollars": round(spot),
        "burst_dollars": round(burst),
        "total_dollar_ratio": ratio,
        "within_completion": within,
        "max_jct_ratio": worst["spot_jct_ratio"],
        "worst": f"{worst['variant']} {worst['size']}",
        "interruptions": sum(c["spot_interruptions"] for c in chosen),
        "goal_met": ratio is not None and ratio <= SPOT_GOAL and within == len(chosen),
    }


def summary(cells: list[dict], sigma: float, *, tuned: bool | None = None) -> dict:
    chosen = [c for c in cells if c["sigma"] == sigma and (tuned is None or c["tuned_on"] == tuned)]
    if not chosen:
        return {}
    tm = sum(c["tm_dollars"] for c in chosen)
    burst = sum(c["burst_dollars"] for c in chosen)
    worst = max(chosen, key=lambda c: (not c["holds"], max(c["jct_ratio"], c["dollar_ratio"])))
    limit = 1.05 if sigma == 0 else 1.08
    return {
        "sigma": sigma,
        "cells": len(chosen),
        "holding": sum(c["holds"] for c in chosen),
        "within_completion": sum(c["jct_ratio"] <= limit for c in chosen),
        "within_dollars": sum(c["tm_dollars"] <= c["burst_dollars"] + 0.005 for c in chosen),
        "tm_dollars": round(tm),
        "burst_dollars": round(burst),
        "total_dollar_ratio": round(tm / burst, 3) if burst else None,
        "max_jct_ratio": max(c["jct_ratio"] for c in chosen),
        "worst": f"{worst['variant']} {worst['size']}: ${worst['tm_dollars']:,.0f} "
        f"vs ${worst['burst_dollars']:,.0f},"
        f" completion x{worst['jct_ratio']}",
    }


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _jct(c: dict, policy: str) -> str:
    """A baseline's average completion as a multiple of burst's ("-": not run)."""
    return _num(c[f"{policy}_jct_s"] / c["burst_jct_s"] if f"{policy}_jct_s" in c else None, ".3f")


def print_matrix(cells: list[dict]) -> None:
    print(
        f"{'variant':12} {'size':6} {'sigma':>5} {'tm $':>10} {'burst $':>10} {'$ ratio':>8} {'jct ratio':>9} "
        f"{'b-after $':>10} {'b-after jct':>11} {'w-local jct':>11} {'fifo jct':>8} {'spot $':>10} {'spot jct':>8} "
        f"{'holds':>6}"
    )
    for c in cells:
        mark = "" if c["tuned_on"] else " (held out)"
        print(
            f"{c['variant']:12} {c['size']:6} {c['sigma']:>5} {c['tm_dollars']:>10,.0f} {c['burst_dollars']:>10,.0f} "
            f"{c['dollar_ratio']:>8} {c['jct_ratio']:>9} {_num(c.get('burst-after_dollars'), ',.0f'):>10} "
            f"{_jct(c, 'burst-after'):>11} {_jct(c, 'wait-local'):>11} {_jct(c, 'local-fifo'):>8} "
            f"{_num(c.get('spot_dollars'), ',.0f'):>10} {_num(c.get('spot_jct_ratio'), '.3f'):>8} "
            f"{'yes' if c['holds'] else 'NO':>6}{mark}"
        )
    for sigma in SIGMAS:
        for label, tuned in (("all", None), ("tuned-on", True), ("held-out", False)):
            s = summary(cells, sigma, tuned=tuned)
            if s:
                print(
                    f"sigma {sigma} {label:9}: {s['holding']}/{s['cells']} cells hold ($ {s['within_dollars']}, "
                    f"completion {s['within_completion']}); total ${s['tm_dollars']:,} vs ${s['burst_dollars']:,}: x"
                    f"{s['total_dollar_ratio']} of burst; max completion x{s['max_jct_ratio']}; worst {s['worst']}"
                )
            s = spot_summary(cells, sigma, tuned=tuned)
            if s:
                print(
                    f"sigma {sigma} {label:9} spot: {s['cells']} cells; cloud ${s['spot_dollars']:,} vs burst "
                    f"${s['burst_dollars']:,}: x{s['total_dollar_ratio']} (goal <= x{SPOT_GOAL}); completion within "
                    f"limit in {s['within_completion']}/{s['cells']}, max x{s['max_jct_ratio']} ({s['worst']}); "
                    f"{s['interruptions']} interruptions; goal {'met' if s['goal_met'] else 'NOT met'}"
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--quick", action="store_true", help="the tuning subset only (4 variants x 2 sizes, sigma 0)")
    p.add_argument("--variants", nargs="*", help="only these variants")
    p.add_argument("--sizes", nargs="*", help="only these fleet sizes, as LOCAL+RESERVED")
    p.add_argument("--sigmas", nargs="*", type=float, help="only these estimate errors")
    p.add_argument("--policies", nargs="*", default=["trainmaster", SPOT, *BASELINES], help="run only these")
    p.add_argument("--workers", type=int, default=MAX_WORKERS)
    p.add_argument("--cache", type=Path, default=None, help="JSON lines of finished runs (read, then appended)")
    p.add_argument("--read-cache", type=Path, nargs="*", default=[], help="more finished runs, only read")
    p.add_argument("--exchange-rate", type=float, default=None, help="override the policy default")
    p.add_argument("--cost-sensitive-weight", type=float, default=None, help="override the policy default")
    p.add_argument("--cost-sensitive-backlog-weight", type=float, default=None, help="override the policy default")
    p.add_argument("--one-owned-queue", choices=("on", "off"), default=None, help="override the policy default")
    p.add_argument("--owned-choice-charge", choices=("on", "off"), default=None, help="override the policy default")
    p.add_argument("--owned-wait-order", choices=("on", "off"), default=None, help="override the policy default")
    p.add_argument("--spot-hazard-scale", type=float, default=1.0, help="spot column: hazards times this")
    p.add_argument("--report-only", action="store_true", help="print the cells the cache has; run nothing")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    names = args.variants or (list(TUNING_VARIANTS) if args.quick else variants(args.data))
    sizes = (
        [tuple(int(n) for n in s.split("+")) for s in args.sizes]
        if args.sizes
        else (TUNING_SIZES if args.quick else SIZES)
    )
    sigmas = args.sigmas or ((0.0,) if args.quick else SIGMAS)
    todo = runs(names, sizes, sigmas, tuple(args.policies))
    extra = ["--exchange-rate", str(args.exchange_rate)] if args.exchange_rate is not None else []
    extra += ["--cost-sensitive-weight", str(w)] if (w := args.cost_sensitive_weight) is not None else []
    extra += (
        ["--cost-sensitive-backlog-weight", str(b)] if (b := args.cost_sensitive_backlog_weight) is not None else []
    )
    extra += ["--one-owned-queue", args.one_owned_queue] if args.one_owned_queue is not None else []
    extra += ["--owned-choice-charge", args.owned_choice_charge] if args.owned_choice_charge is not None else []
    extra += ["--owned-wait-order", args.owned_wait_order] if args.owned_wait_order is not None else []
    extra += ["--spot-hazard-scale", str(args.spot_hazard_scale)] if args.spot_hazard_scale != 1.0 else []
    code = run_version(code_version(), args.data, extra)
    results = load_runs([*args.read_cache, *([args.cache] if args.cache and args.cache.exists() else [])], code=code)
    pending = [] if args.report_only else [(run, args.data, extra) for run in todo if _key(run) not in results]
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, MAX_WORKERS))) as pool:
        for key, result in pool.map(_simulate, pending):
            results[key] = result
            if args.cache:
                with args.cache.open("a") as f:
                    f.write(json.dumps([f"{key}|{code}", result]) + "\n")
            dollars = result.get("cloud_dollars", result["on_demand_dollars"])
            print(
                f"done {key}: ${dollars:,.0f}, avg completion {result['avg_jct_s']:,.0f} s", file=sys.stderr, flush=True
            )
    cells = [c for v in names for size in sizes for sigma in sigmas if (c := cell(results, v, *size, sigma))]
    if args.json:
        json.dump(
            {
                "cells": cells,
                "summary": [summary(cells, s) for s in SIGMAS],
                "spot": [spot_summary(cells, s) for s in SIGMAS],
            },
            sys.stdout,
        )
        print()
    else:
        print_matrix(cells)
    return 0


if __name__ == "__main__":
    sys.exit(main())
