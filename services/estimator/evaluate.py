"""Evaluate ETA estimators on MLPerf runs never trained on (`trainmaster-eta-eval`).

`--split round`: train only on the `--train` tarballs, test on every successful run of `--test` (the
headline: new round, new systems, new benchmarks). `--split submitter` (default): the test tarball's
submitters held out (`--kfold K` folds, or one held-out share), the rest of it trained on too.
`--split benchmark`: the same with the test tarball's benchmarks held out (every run of a held-out benchmark
leaves training): with `--train` and `--test` the same tarball (v3.1), the development analogue of a new
round's unseen benchmarks, so the round's own test runs are not tuned on. `--split accelerator`: the same with the
test tarball's accelerator models held out (the development analogue of a new round's new accelerators);
`--split generation`: their generations held out (every Hopper part together, every TPU), the analogue of hardware
whose whole generation the history never saw. Every report also groups the test runs by whether their accelerator's
generation was trained on (`seen_generation`, `new_generation`).
`--targets FILE` declares the quality target of benchmarks the built-in table does not know.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from services.estimator.model.baselines import Baseline, CurveOnly, MedianDuration, WorkOverThroughput
from services.estimator.model.calibrate import make_estimator, replay, train_with_calibration
from services.estimator.model.corpus import Run, default_tarballs, is_usable, load_cached
from services.estimator.model.features import normalise_accelerator
from services.estimator.model.hardware import generation
from services.estimator.model.online import OnlineEstimator
from services.estimator.model.owncurve import POWER_FITS
from services.estimator.model.targets import Target, parse_targets
from services.estimator.scoring import summarise

CUTS = (0.1, 0.2, 0.3, 0.5, 0.8)
HEADLINE_METHOD = "eta_blend"
MAX_TARGETS_FILE = 1 << 20


def scorable(run: Run) -> bool:
    """A successful test run the harness can replay and score: a target, progress, the target met."""
    return run.succeeded and run.target is not None and run.total_work is not None and run.reached_target()


def _row(run: Run, now: float, pred: float | None, **extra: object) -> dict:
    return {
        "truth": run.duration_s,
        "now": now,
        "pred": pred,
        "benchmark": run.benchmark,
        "accelerator": normalise_accelerator(run.accelerator),
        "generation": generation(run.accelerator),
        **extra,
    }


def evaluate_split(
    train: list[Run], test: list[Run], *, unscorable: Sequence[Run] = (), folds: int = 3, seed: int = 0
) -> dict[str, dict]:
    """Per-method, per-cut rows of one train/test split (unscorable test runs: rows without a prediction)."""
    predictor = train_with_calibration(train, folds=folds, seed=seed)
    baselines: dict[str, Baseline] = {
        "median_duration": MedianDuration(train),
        "work_over_throughput": WorkOverThroughput(train),
        "optimus_only": CurveOnly(),
        # Not a method: the median work of every run with the same benchmark and batch
        # size, the test runs included, over the live rate. What is left of its error
        # is run-to-run variance no feature known before the cut can explain (seeds).
        "bound_median_work_all_runs": WorkOverThroughput(train + test),
    }
    rows: dict[str, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    for run in test:
        est = make_estimator(run, predictor)

        def visit(frac: float, now: float, est: OnlineEstimator, run: Run = run) -> None:
            e = est.estimate(now)
            pred = now + e.remaining_s if math.isfinite(e.remaining_s) else None
            rows[HEADLINE_METHOD][frac].append(
                _row(run, now, pred, low=e.low_s, high=e.high_s, method=e.method, run_id=run.run_id)
            )
            for name, base in baselines.items():
                rows[name][frac].append(_row(run, now, base.total(run, now, est)))

        replay(run, est, CUTS, visit)
    for run in unscorable:
        for method in [HEADLINE_METHOD, *baselines]:
            for frac in CUTS:
                rows[method][frac].append(_row(run, frac * run.duration_s, None))
    return rows


# -- splits -------------------------------------------------------------------------------
def split_key(run: Run, by: str) -> str:
    """What a split holds out of a run: its submitter, benchmark, accelerator model (the vocabulary's word) or the
    accelerator's generation."""
    if by == "accelerator":
        return normalise_accelerator(run.accelerator)
    return generation(run.accelerator) if by == "generation" else getattr(run, by)


def split_holdout(
    runs_train: Iterable[Run], runs_test: Iterable[Run], *, share: float = 1 / 3, seed: int = 0, by: str = "submitter"
) -> list[set[str]]:
    """Hold out a share of the test corpus's submitters (or benchmarks); drop them from training too."""
    subs = sorted({split_key(r, by) for r in runs_test})
    random.Random(seed).shuffle(subs)
    held = set(subs[: max(1, round(len(subs) * share))])
    return [held]


def split_kfold(
    runs_train: Iterable[Run], runs_test: Iterable[Run], *, k: int, seed: int = 0, by: str = "submitter"
) -> list[set[str]]:
    """k folds over the test corpus's submitters (or benchmarks); each fold is held out of training."""
    subs = sorted({split_key(r, by) for r in runs_test})
    random.Random(seed).shuffle(subs)
    return [set(subs[i::k]) for i in range(k)]


def run_evaluation(
    train_paths: Sequence[str | Path],
    test_path: str | Path,
    *,
    split: str = "submitter",
    kfold: int = 0,
    seed: int = 0,
    share: float = 1 / 3,
    targets: dict[str, Target] | None = None,
    cache_dir: Path | None = None,
) -> dict:
    """Load corpora, split, evaluate every method at every cut; the report the README quotes."""

    def load(path: str | Path) -> list[Run]:
        return load_cached(path, targets=targets, cache_dir=cache_dir)

    test_all = [r for r in load(test_path) if r.succeeded]
    others = [r for p in train_paths if str(p) != str(test_path) for r in load(p)]
    test_ok = [r for r in test_all if scorable(r)]
    test_bad = [r for r in test_all if not scorable(r)]
    if split == "round":
        if any(str(p) == str(test_path) for p in train_paths):
            raise ValueError("param[--train] invalid: a round split never trains on its --test tarball")
        plans: list[tuple[set[str] | None, list[Run], list[Run], list[Run]]] = [
            (None, [r for r in others if is_usable(r)], test_ok, test_bad)
        ]
    else:
        by = split
        pool = [r for r in others + test_all if is_usable(r)]
        helds = (
            split_kfold(pool, test_all, k=kfold, seed=seed, by=by)
            if kfold > 1
            else split_holdout(pool, test_all, share=share, seed=seed, by=by)
        )
        plans = [
            (
                held,
                [r for r in pool if split_key(r, by) not in held],
                [r for r in test_ok if split_key(r, by) in held],
                [r for r in test_bad if split_key(r, by) in held],
            )
            for held in helds
        ]
    merged: dict[str, dict[float, list]] = defaultdict(lambda: defaultdict(list))
    splits = []
    seen_bench, seen_accel = set(), set()
    for held, train, test, bad in plans:
        seen_b = {r.benchmark for r in train}
        seen_a = {normalise_accelerator(r.accelerator) for r in train}
        seen_g = {generation(r.accelerator) for r in train}
        seen_bench |= seen_b
        seen_accel |= seen_a
        splits.append(
            {
                f"held_out_{split if split != 'round' else 'submitter'}s": sorted(held) if held else None,
                "train_runs": len(train),
                "test_runs": len(test) + len(bad),
                "test_unscorable": len(bad),
                "unseen_benchmarks": sorted({r.benchmark for r in test + bad} - seen_b),
            }
        )
        for method, by_cut in evaluate_split(train, test, unscorable=bad, seed=seed).items():
            for frac, rows in by_cut.items():
                for row in rows:
                    row["group_bench"] = "seen" if row["benchmark"] in seen_b else "unseen"
                    row["group_accel"] = "seen_accelerator" if row["accelerator"] in seen_a else "new_accelerator"
                    row["group_gen"] = "seen_generation" if row["generation"] in seen_g else "new_generation"
                merged[method][frac] += rows
    return _report(merged, split=split, splits=splits, test_path=test_path, train_paths=train_paths)


def _report(
    merged: dict[str, dict[float, list]],
    *,
    split: str,
    splits: list[dict],
    test_path: str | Path,
    train_paths: Sequence[str | Path],
) -> dict:
    report: dict = {  # the JSON document the README quotes
        "split": split,
        "train": [str(p) for p in train_paths],
        "test": str(test_path),
        "headline_method": HEADLINE_METHOD,
        "cuts": [f"{int(c * 100)}%" for c in CUTS],
        "unseen_benchmarks": sorted({b for s in splits for b in s["unseen_benchmarks"]}),
        "splits": splits,
        "methods": {},
    }
    for method, by_cut in merged.items():
        entry = {f"{int(f * 100)}%": summarise(rows) for f, rows in sorted(by_cut.items())}
        entry["by_benchmark"] = {f"{int(f * 100)}%": _grouped(rows, "benchmark") for f, rows in sorted(by_cut.items())}
        entry["by_group"] = {
            f"{int(f * 100)}%": {
                **_grouped(rows, "group_bench"),
                **_grouped(rows, "group_accel"),
                **_grouped(rows, "group_gen"),
            }
            for f, rows in sorted(by_cut.items())
        }
        report["methods"][method] = entry
    return report


def _grouped(rows: list[dict], key: str) -> dict[str, dict]:
    by = defaultdict(list)
    for r in rows:
        by[r[key]].append(r)
    return {b: summarise(v) for b, v in sorted(by.items())}


def _print_table(report: dict) -> None:
    print(
        f"split {report['split']}: train {report['train']} test {report['test']}; "
        f"unseen benchmarks {report['unseen_benchmarks']}"
    )
    for method, entry in report["methods"].items():
        print(f"\n{method}{' (headline)' if method == report['headline_method'] else ''}")
        print(
            f"{'cut':>5} {'group':>16} {'n':>5} {'n_tot':>5} {'medAPE':>7} {'MAPE':>7} {'<=20%':>6} "
            f"{'remErr_s':>9} {'cov':>5}"
        )
        for cut in report["cuts"]:
            for group, s in [("all", entry[cut]), *entry["by_group"][cut].items()]:
                if not s.get("n"):
                    continue
                cov = s.get("coverage_10_90")
                print(
                    f"{cut:>5} {group:>16} {s['n']:>5} {s['n_total']:>5} {s['median_ape']:7.3f} "
                    f"{s['mape']:7.3f} {s['within_20pct']:6.3f} {s['median_abs_err_remaining_s']:9.1f} "
                    f"{'' if cov is None else f'{cov:5.3f}'}"
                )


def read_targets(path: str) -> dict[str, Target]:
    """The `--targets` file, checked field by field."""
    raw = Path(path).read_bytes()
    if len(raw) > MAX_TARGETS_FILE:
        raise ValueError(f"param[--targets] invalid: file larger than {MAX_TARGETS_FILE} bytes")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"param[--targets] invalid: not JSON ({exc})") from None
    return parse_targets(obj)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: trainmaster-eta-eval --train TARBALL [...] --test TARBALL [--split round|submitter] [--kfold K]."""
    defaults = [str(p) for p in default_tarballs()]
    ap = argparse.ArgumentParser(
        prog="trainmaster-eta-eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--train", nargs="+", default=defaults[:-1] or defaults)
    ap.add_argument("--test", default=defaults[-1] if defaults else None)
    ap.add_argument(
        "--split",
        choices=("submitter", "benchmark", "accelerator", "generation", "round", "family", "unseen"),
        default="submitter",
        help="family: own-jobs only, leave-one-family-out (fine-tunes the curve "
        "prior per family); unseen: own-jobs only, the shipped estimator on the families it never saw",
    )
    ap.add_argument(
        "--kfold", type=int, default=0, help="k folds over test submitters or benchmarks (submitter, benchmark split)"
    )
    ap.add_argument(
        "--share",
        type=float,
        default=1 / 3,
        help="held-out share of submitters or benchmarks (submitter, benchmark split)",
    )
    ap.add_argument(
        "--targets",
        help='JSON {"<benchmark>": {"metric", "target", "mode"}} for benchmarks the built-in table does not know',
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "trainmaster" / "eta-corpus",
        help="parsed-corpus cache folder ('' to disable)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--corpus",
        choices=("mlperf", "own-jobs"),
        default="mlperf",
        help="own-jobs: the recorded small trainings (bench/search/data), held-out seeds",
    )
    ap.add_argument(
        "--sweep",
        type=Path,
        nargs="+",
        help="own-jobs: the recorded files (default: the eleven families the shipped estimator is tuned on; "
        "--split unseen: families2.jsonl.gz, which it never saw)",
    )
    ap.add_argument(
        "--no-prior-baselines",
        action="store_true",
        help="own-jobs --split family: leave out the fine-tuned and the synthetic prior alone (each padded again)",
    )
    ap.add_argument(
        "--calibration",
        type=Path,
        help="own-jobs: the calibration (default: the shipped one; --split unseen: the one scored, --split family: "
        "the baselines' that saw the family, e.g. a build's --curve-out)",
    )
    ap.add_argument(
        "--table",
        type=Path,
        help="own-jobs --split unseen: the blend table scored (default: the shipped one; e.g. a build's --out)",
    )
    ap.add_argument(
        "--power-fit",
        choices=POWER_FITS,
        help="own-jobs --split family: the power law of every fold's fitted curve (ownbuild --power-fit)",
    )
    ap.add_argument("--refit", action="store_true", help="own-jobs: fit the calibration here instead")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--out", type=Path, help="also write the JSON report to this file")
    args = ap.parse_args(argv)
    if args.corpus == "own-jobs":
        return _own_jobs(args, ap)
    if args.split in ("family", "unseen"):
        ap.error(f"param[--split] invalid: the {args.split} split is the own-jobs corpus's (--corpus own-jobs)")
    for name, given in (("--calibration", args.calibration), ("--table", args.table), ("--power-fit", args.power_fit)):
        if given is not None:
            ap.error(f"param[{name}] invalid: it is the own-jobs corpus's (--corpus own-jobs)")
    if not args.test:
        ap.error("no --test tarball and none under the default data folder")
    try:
        targets = read_targets(args.targets) if args.targets else None
        started = time.time()
        report = run_evaluation(
            args.train,
            args.test,
            split=args.split,
            kfold=args.kfold,
            seed=args.seed,
            share=args.share,
            targets=targets,
            cache_dir=args.cache if str(args.cache) else None,
        )
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    return _emit(report, args, started=started, table=_print_table)


def _own_jobs(args: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    from services.estimator import owneval
    from services.estimator.model import owncorpus, owncurve

    if args.table is not None and args.split != "unseen":
        ap.error("param[--table] invalid: only --split unseen scores a given blend table (the others fit their own)")
    if args.power_fit is not None and args.split != "family":
        ap.error("param[--power-fit] invalid: only --split family builds its folds (a calibration names its own fit)")
    calibration = args.calibration or owncurve.CALIBRATION
    try:
        started = time.time()
        if args.split == "family":
            from services.estimator import ownfamily

            report = ownfamily.run_family_evaluation(
                tuple(args.sweep or owncorpus.TRAINED),
                refit=args.refit,
                cache_dir=args.cache if str(args.cache) else None,
                baselines=not args.no_prior_baselines,
                power_fit=args.power_fit or owncurve.PLAIN,
                calibration_path=calibration,
            )
            return _emit(report, args, started=started, table=ownfamily.print_family_table)
        if args.split == "unseen":
            from services.estimator import ownfamily
            from services.estimator.model.curveprior import blendtable

            report = ownfamily.run_unseen_evaluation(
                tuple(args.sweep or owncorpus.UNSEEN),
                calibration_path=calibration,
                table_path=args.table or blendtable.TABLE,
            )
            return _emit(report, args, started=started, table=ownfamily.print_family_table)
        report = owneval.run_own_evaluation(
            tuple(args.sweep or owncorpus.TRAINED),
            refit=args.refit,
            calibration_path=calibration,
        )
    except (OSError, ValueError) as exc:
        ap.error(str(exc))
    return _emit(report, args, started=started, table=owneval.print_own_table)


def _emit(report: dict, args: argparse.Namespace, *, started: float, table: Callable[[dict], None]) -> int:
    """Time the report, write it where asked (`--out`), print it as JSON (`--json`) or as a table."""
    report["seconds"] = round(time.time() - started, 1)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
