"""Issue 31's plain jobs replayed offline through the served estimator, by one build's fitted curve and blend table or
another's (`ownbuild --curve-out`, `--out`): what the tracker would have published as it followed each job.

The jobs, none of them in the own-jobs corpus the builds are fitted on, all a loss falling to a declared target:

- `synthetic-power`: issue 31's kind of curve, `0.012 + 0.6·(1 + s/30)^-0.9` to 0.02 (a deep target on a slow
  power-law tail), a line every 10 steps of 50 ms, no noise;
- `e2e-own-sgd`: the own training of the e2e test (`tests/e2e/test_eta_replay.py`'s `OWN_TRAINING`: a numpy MLP on
  the digits, SGD with momentum, a running mean of 50 losses) to its three targets 0.3 / 0.2 / 0.12, run here without
  its pause, its steps timed at the test's 50 ms;
- `e2e-conv-adam`: the e2e test's conv classifier (`tests/e2e/test_eta_curveprior.py`'s `CONV_TRAINING`: Adam,
  warm-up and cosine, an EMA) to 0.45 / 0.35, its steps at the test's 15 ms;
- `sgd-regression`: the recorded small SGD regressions of issue 31's table (`bench/search/data/families3.jsonl.gz`,
  23 jobs at targets 0.05 / 0.03 / 0.02, their recorded start-up and times), as `bench.search.served` replays them.

`--pace K` replays every job's lines at K times their recorded time a step (the recorded start-up kept): the same curves
as a heavier model's, so the start-up is the share of the run it is in a job of the issue's length (its first job ran
~3.5 min, families3's 16-65 s, of which the start-up took up to half before the first line).

Each job goes through `JobModel` line by line, an estimate published at most once a second (`bench.search.served`);
at 10/20/30/50/80% of the job the latest published one is scored against the truth then: its signed error of the
time left, within ±20%, and whether the 10-90% band holds the truth (a second of slack).

    nice -n 10 .venv/bin/python -m bench.eta.plain_jobs --build plain= \\
        --build tail=/tmp/owncurve-tail.json,/tmp/blend-tail.json --out bench/eta/results/plain-jobs.json
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from bench.search import served
from services.estimator import tracker
from services.estimator.model.curveprior import blendtable
from services.estimator.model.owncurve import CALIBRATION, PLAIN, load_calibration

ROOT = Path(__file__).resolve().parents[2]
OWN_SGD = (ROOT / "tests" / "e2e" / "test_eta_replay.py", "OWN_TRAINING", (0.3, 0.2, 0.12), 0.05)
CONV_ADAM = (ROOT / "tests" / "e2e" / "test_eta_curveprior.py", "CONV_TRAINING", (0.45, 0.35), 0.015)
STEP_REGEX = served.REGEX["step"]


def synthetic_power() -> dict:
    """Issue 31's kind of curve (docs/estimator.md), noise-free: a line every 10 steps of 50 ms."""
    points = [{"t": 0.05 * s, "step": s, "loss": 0.012 + 0.6 * (1 + s / 30) ** -0.9} for s in range(10, 4001, 10)]
    return {"run": "synthetic-power", "family": "synthetic-power", "points": points}


def e2e_training(path: Path, name: str, deepest: float, step_s: float, family: str) -> dict:
    """The e2e test's training script (read from the test's source, not imported), run here to its deepest target
    without its pause; each printed line timed at its step times the test's pause."""
    source = next(
        ast.literal_eval(node.value)
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets)
    )
    out = subprocess.run(
        [sys.executable, "-c", source, str(deepest), "0"], capture_output=True, text=True, check=True, timeout=600
    ).stdout
    points = []
    for line in out.splitlines():
        words = line.split()
        if len(words) == 4 and words[2] == "loss":
            step = int(words[1])
            points.append({"t": step * step_s, "step": step, "loss": float(words[3])})
    if not points:
        raise ValueError(f"{path.name}'s {name} printed no loss")
    return {"run": f"{family}-{name}", "family": family, "points": points}


def paced(run: dict, pace: float) -> dict:
    """`run` with each point's time since its training's start times `pace` (its start-up, if any, as recorded)."""
    return run | {"points": [p | {"t": p["t"] * pace} for p in run["points"]]}


def jobs() -> list[tuple[dict, float]]:
    """Every (run, target) replayed."""
    own = e2e_training(*OWN_SGD[:2], min(OWN_SGD[2]), OWN_SGD[3], "e2e-own-sgd")
    conv = e2e_training(*CONV_ADAM[:2], min(CONV_ADAM[2]), CONV_ADAM[3], "e2e-conv-adam")
    recorded = [r for r in served.load(served.DATA) if r["family"] == "sgd-regression"]
    return (
        [(synthetic_power(), 0.02)]
        + [(own, t) for t in OWN_SGD[2]]
        + [(conv, t) for t in CONV_ADAM[2]]
        + [(r, t) for r in recorded for t in served.targets(r)]
    )


@contextlib.contextmanager
def served_by(curve: Path, table: Path) -> Iterator[str]:
    """The tracker reading `curve` and `table` in place of the shipped files; yields the curve's power fit."""
    calibration = load_calibration(curve)
    if calibration is None:
        raise ValueError(f"param[--build] invalid: cannot read a fitted curve from {curve}")
    blend = blendtable.load(table)
    if blend is None:
        raise ValueError(f"param[--build] invalid: cannot read a blend table from {table}")
    with (
        mock.patch.object(tracker, "calibration", lambda: calibration),
        mock.patch.object(tracker, "blend_table", lambda: blend),
    ):
        yield str(calibration.get("power_fit", PLAIN))


def summary(replayed: list[dict]) -> dict:
    """Per kind of job and cut: jobs, median signed error of the time left, within ±20%, band coverage (a cut
    without an estimate misses both)."""
    kinds = sorted({j["family"] for j in replayed})
    out: dict = {}
    for kind in kinds + ["all"]:
        group = [j for j in replayed if kind in ("all", j["family"])]
        rows = {}
        for cut in served.CUTS:
            got = [j["cuts"][cut] for j in group]
            errors = [g["error"] for g in got if g and g["error"] is not None]
            rows[f"{int(cut * 100)}%"] = {
                "n": len(got),
                "median_error": round(statistics.median(errors), 3) if errors else None,
                "within_20": round(sum(abs(e) <= 0.2 for e in errors) / len(got), 3),
                "coverage": round(sum(bool(g and g["inside"]) for g in got) / len(got), 3),
            }
        out[kind] = rows
    return out


def parse_build(text: str) -> tuple[str, Path, Path]:
    """`name=` (the shipped files) or `name=CURVE,TABLE`."""
    name, _, files = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"param[--build] invalid: {text!r} names no build (NAME=CURVE,TABLE)")
    if not files:
        return name, CALIBRATION, blendtable.TABLE
    curve, _, table = files.partition(",")
    if not curve or not table:
        raise argparse.ArgumentTypeError(f"param[--build] invalid: {text!r} is not NAME=CURVE,TABLE")
    return name, Path(curve), Path(table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--build", type=parse_build, action="append", required=True, help="NAME= (shipped) or NAME=CURVE,TABLE"
    )
    ap.add_argument("--out", type=Path, help="every job's cuts and the summaries, as JSON")
    ap.add_argument("--pace", type=float, default=1.0, help="each step K times as long as recorded (start-up kept)")
    args = ap.parse_args(argv)
    if not (math.isfinite(args.pace) and args.pace > 0):
        ap.error(f"param[--pace] invalid: {args.pace} is not a positive number")
    todo = [(paced(run, args.pace), target) for run, target in jobs()]
    report: dict = {"jobs": len(todo), "pace": args.pace, "builds": {}}
    for name, curve, table in args.build:
        with served_by(curve, table) as fit:
            replayed = [job for run, target in todo if (job := served.replay(run, target, STEP_REGEX)) is not None]
        result = summary(replayed)
        report["builds"][name] = {"curve": str(curve), "table": str(table), "power_fit": fit, "summary": result}
        report["builds"][name]["jobs"] = replayed
        print(f"build {name} ({curve.name}, {table.name}; power fit {fit}): {len(replayed)} jobs")
        print(f"{'kind':>16} " + " ".join(f"{c:>22}" for c in result["all"]))
        for kind, rows in result.items():
            cells = [
                f"{r['median_error']!s:>7} {r['within_20']:>5.2f} {r['coverage']:>5.2f} n{r['n']}"
                for r in rows.values()
            ]
            print(f"{kind:>16} " + " ".join(f"{c:>22}" for c in cells))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
