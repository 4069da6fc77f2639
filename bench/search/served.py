"""Recorded runs replayed as plain jobs through the served `JobModel`, as the estimator service follows a job that
declares only a target: each printed point becomes a `step N loss X` line at its wall time (after the recorded
start-up: a job's clock starts with its process), the job ends when its printed loss first meets the target, and
the estimate is taken whenever the service would publish one (on a line, at most once a second).

At each cut (10/20/30/50/80% of the job's duration) the latest published estimate is scored against the truth at
its own time: within ±20% of the time left, and whether the 10-90% band holds it (a second of slack, as the e2e
test allows). No estimate by a cut is a miss of both. `--regex value` reads the loss alone (no step group).

    .venv/bin/python -m bench.search.served --data bench/search/data/families3.jsonl.gz --out before.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

from shared.events import LogLine
from shared.jobs import MetricSpec
from services.estimator.jobmodel import JobModel

DATA = Path(__file__).parent / "data" / "families3.jsonl.gz"
CUTS = (0.1, 0.2, 0.3, 0.5, 0.8)
REGEX = {
    "step": r"step (?P<step>\d+) loss (?P<value>[0-9.e-]+)",
    "value": r"loss (?P<value>[0-9.e-]+)",
}
PUBLISH_EVERY_S = 1.0  # services/estimator/service.py: at most one estimate a second
SLACK_S = 1.0


def load(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def targets(run: dict) -> tuple[float, ...]:
    from bench.search.families3 import TARGETS

    return TARGETS.get(run["family"], ())


def replay(run: dict, target: float, regex: str) -> dict | None:
    """One job: the run to its target's first crossing; None when the run never meets it."""
    startup = float(run.get("startup_s", 0.0))
    points = run["points"]
    hit = next((i for i, p in enumerate(points) if p["loss"] <= target), None)
    if hit is None or hit == 0:
        return None
    end = startup + points[hit]["t"]
    spec = MetricSpec(name="loss", regex=regex, mode="min", target=target)
    model = JobModel(metrics=[spec])
    model.started(at=0.0, accelerator="cpu", gpus=0, nodes=1)
    published: list[tuple[float, float, float, float, str]] = []
    last = -PUBLISH_EVERY_S
    for p in points[:hit]:  # the crossing line ends the job: nothing is published after it
        t = startup + p["t"]
        model.observe(LogLine(t=t, line=f"step {p['step']} loss {p['loss']:.6f}"))
        if t - last < PUBLISH_EVERY_S:
            continue
        eta = model.estimate(t, None, None)
        if eta is not None:
            last = t
            published.append((t, eta.remaining_s, eta.low_s, eta.high_s, eta.method or ""))
    cuts = {}
    for cut in CUTS:
        seen = [e for e in published if e[0] <= cut * end]
        if not seen:
            cuts[cut] = None
            continue
        t, remaining, low, high, method = seen[-1]
        truth = end - t
        cuts[cut] = {
            "t": round(t, 2),
            "truth": round(truth, 2),
            "remaining": round(remaining, 2),
            "low": round(low, 2),
            "high": round(high, 2),
            "method": method,
            "error": round((remaining - truth) / truth, 3) if truth > 0 else None,
            "inside": low - SLACK_S <= truth <= high + SLACK_S,
        }
    first = published[0][0] / end if published else None
    return {"run": run["run"], "family": run["family"], "target": target, "end": end, "first": first, "cuts": cuts}


def summary(jobs: list[dict]) -> dict:
    """Per family and cut: jobs, within ±20%, band coverage (a missing estimate misses both), median |error|."""
    out: dict = {}
    by_family = defaultdict(list)
    for job in jobs:
        by_family[job["family"]].append(job)
    for family, group in sorted(by_family.items()) + [("all", jobs)]:
        rows = {}
        for cut in CUTS:
            got = [j["cuts"][cut] for j in group]
            errors = [abs(g["error"]) for g in got if g and g["error"] is not None]
            rows[f"{int(cut * 100)}%"] = {
                "n": len(got),
                "estimated": sum(g is not None for g in got),
                "within_20": round(sum(e <= 0.2 for e in errors) / len(got), 3),
                "coverage": round(sum(bool(g and g["inside"]) for g in got) / len(got), 3),
                "median_abs_error": round(statistics.median(errors), 3) if errors else None,
                "median_error": round(statistics.median(g["error"] for g in got if g and g["error"] is not None), 3)
                if errors
                else None,
            }
        firsts = [j["first"] for j in group if j["first"] is not None]
        out[family] = {
            "jobs": len(group),
            "first_estimate_median": round(statistics.median(firsts), 3) if firsts else None,
            "cuts": rows,
        }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--regex", choices=sorted(REGEX), default="step")
    parser.add_argument("--out", type=Path, default=None, help="every job's cuts and the summary, as JSON")
    args = parser.parse_args(argv)
    jobs = [
        job
        for run in load(args.data)
        for target in targets(run)
        if (job := replay(run, target, REGEX[args.regex])) is not None
    ]
    result = summary(jobs)
    print(f"{len(jobs)} jobs from {args.data} (regex: {args.regex})")
    print(f"{'family':>16} {'cut':>4} {'n':>3} {'est':>3} {'<=20%':>6} {'cov':>6} {'med err':>8} {'med|err|':>8}")
    for family, entry in result.items():
        for cut, row in entry["cuts"].items():
            print(
                f"{family:>16} {cut:>4} {row['n']:>3} {row['estimated']:>3} {row['within_20']:>6.2f} "
                f"{row['coverage']:>6.2f} {row['median_error']!s:>8} {row['median_abs_error']!s:>8}"
            )
        print(f"{family:>16} first estimate at {entry['first_estimate_median']} of the run (median)")
    if args.out is not None:
        args.out.write_text(json.dumps({"summary": result, "jobs": jobs}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
