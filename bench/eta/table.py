"""Markdown tables of a `trainmaster-eta-eval` report, as the README quotes them.

python -m bench.eta.table bench/eta/results/eval-round-v3.1-v4.0.json [--benchmarks]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _line(label: str, cut: str, s: dict) -> str:
    if not s.get("n"):
        return f"| {label} | {cut} | 0 / {s.get('n_total', 0)} | — | — | {_pct(s.get('within_20pct', 0.0))} | — |"
    return (
        f"| {label} | {cut} | {s['n']} / {s['n_total']} | {_pct(s['median_ape'])} | {_pct(s['mape'])} | "
        f"{_pct(s['within_20pct'])} | {_pct(s.get('coverage_10_90'))} |"
    )


def groups_table(report: dict, methods: list[str]) -> str:
    """Every cut of each method: all runs, then seen and unseen benchmarks, then new accelerators."""
    rows = [
        "| method, runs | cut | scored / total | median error | MAPE | within ±20% | 10–90% coverage |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method in methods:
        entry = report["methods"][method]
        for group in ("all", "seen", "unseen", "new_accelerator"):
            for cut in report["cuts"]:
                s = entry[cut] if group == "all" else entry["by_group"][cut].get(group)
                if s is not None:
                    rows.append(_line(f"{method}, {group}", cut, s))
    return "\n".join(rows)


def benchmark_table(report: dict, method: str) -> str:
    """Within ±20% (median error) per benchmark and cut."""
    cuts = report["cuts"]
    entry = report["methods"][method]["by_benchmark"]
    benches = sorted({b for cut in cuts for b in entry[cut]})
    rows = ["| benchmark | " + " | ".join(cuts) + " |", "|---|" + "---:|" * len(cuts)]
    for b in benches:
        cells = []
        for cut in cuts:
            s = entry[cut].get(b, {})
            cells.append(f"{_pct(s.get('within_20pct'))} ({_pct(s.get('median_ape'))})" if s.get("n") else "—")
        label = f"{b} (unseen)" if b in report.get("unseen_benchmarks", []) else b
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", type=Path)
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--benchmarks", action="store_true", help="also the per-benchmark table of the headline")
    args = ap.parse_args(argv)
    report = json.loads(args.report.read_text())
    methods = args.methods or [report["headline_method"], "work_over_throughput"]
    print(groups_table(report, methods))
    if args.benchmarks:
        print()
        print(benchmark_table(report, report["headline_method"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
