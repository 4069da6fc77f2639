"""`trainmaster-eta-eval --corpus own-jobs --split family`: leave-one-family-out scores of the own-job ETA.

For each family of the own-jobs corpus (`owncorpus.family`), the curve prior pre-trained on synthetic curves only
(`curveprior/pretrained.npz`, family-blind by construction) is fine-tuned on the other families' runs of seeds
0-2, mixed half and half with the synthetic prior (as served) and its conformal pads sized on their seeds 3-4;
every run of the held-out family, all seeds, is then scored at the evaluation's cuts. Beside it: the fine-tuned
network alone and the synthetic prior alone (each with its own pads from the same runs), the headline: that prior
blended with the fitted curve as the tracker serves it (`curveprior.estimate.blended`), and the former
estimator (`owncurve.json`'s networks, fitted on seeds 0-3 of every family: it has seen the held-out family, so
it is a baseline flattered by the split), refitted on the other families only with `--refit`. Torch is imported
here (fine-tuning), never by the service.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from services.estimator import ownchoice, ownnested
from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable, net as priornet
from services.estimator.model.curveprior.blendtable import BlendTable
from services.estimator.model.owncurve import CALIBRATION, PLAIN, POWER_FITS, load_calibration
from services.estimator.owneval import HEADLINE_METRIC, _summary

FIT_SEEDS = (0, 1, 2)
PAD_SEEDS = (3, 4)
HEADLINE = "prior_and_fit_blend"  # what the tracker serves


def _rows(
    test: list[owncorpus.Case],
    *,
    calibration: dict | None,
    prior: priornet.PriorNet | None,
    blend: bool = False,
    table: BlendTable | None = None,
) -> dict[float, list[dict]]:
    return owncorpus.evaluate_cases(test, calibration, prior=prior, blend=blend, table=table)


def run_family_evaluation(
    paths: Iterable[Path] = owncorpus.TRAINED,
    *,
    refit: bool = False,
    metrics: Sequence[str] = (HEADLINE_METRIC,),
    only: tuple[str, ...] = (),
    cache_dir: Path | None = None,
    baselines: bool = True,
    power_fit: str = PLAIN,
    calibration_path: Path = CALIBRATION,
) -> dict:
    """Per held-out family and pooled, per method and cut: the summary rows of `scoring.summarise`. Nested: the
    blend table that scores a family is fitted on the other families' out-of-family readings (`ownnested`), in
    the form chosen on those readings only (`ownchoice.table_for`; the fourth round's form, chosen once on every
    family, beside it).
    `baselines`: also the fine-tuned network alone and the synthetic prior alone (each padded again: slower).
    `power_fit`: the fitted curve's power law in every fold (`ownbuild --power-fit`: the same cached samples and
    folds); `calibration_path`: the fitted curve of the baselines that saw the family (the shipped one, or a build's
    `--curve-out`)."""
    from services.estimator.model.curveprior import train  # torch: only for this evaluation

    runs = owncorpus.load_corpus(tuple(paths))
    if not runs:
        raise ValueError(f"param[--sweep] invalid: no runs in {paths}")
    pretrained = priornet.load(priornet.PRETRAINED)
    if pretrained is None:
        raise ValueError(f"cannot read the pre-trained prior {priornet.PRETRAINED}")
    if power_fit not in POWER_FITS:
        raise ValueError(f"param[--power-fit] invalid: {power_fit!r} is none of {list(POWER_FITS)}")
    shipped = _calibration(calibration_path)
    families = sorted({owncorpus.family(r) for r in runs})
    samples = ownnested.curve_samples(runs, cache_dir, power_fit=power_fit)
    encoded = ownnested.prior_samples(runs, cache_dir)
    folds: dict[str, dict[str, Any]] = {}
    for held in families:  # every family's readings, whichever are scored: each fits the others' tables
        part = ownnested.fold(
            runs,
            held=held,
            pretrained=pretrained,
            samples=samples,
            cache_dir=cache_dir,
            encoded=encoded,
            power_fit=power_fit,
        )
        methods: dict[str, dict[str, Any]] = {
            HEADLINE: {"prior": part.prior, "calibration": part.curve, "blend": True},
            "blend_fourth_round_form": {"prior": part.prior, "calibration": part.curve, "blend": True},
            "blend_former_form": {"prior": part.prior, "calibration": part.curve, "blend": True},
            "blend_shipped_fit_saw_family": {"prior": part.prior, "calibration": shipped, "blend": True},
            "former_blend_shipped_fit_saw_family": {"prior": part.prior, "calibration": shipped, "blend": True},
            "curve_prior": {"prior": part.prior, "calibration": None},
            **(
                {
                    "prior_fine_tuned_only": {"prior": train.with_pads(part.tuned, part.pads), "calibration": None},
                    "prior_synthetic_only": {"prior": train.with_pads(pretrained, part.pads), "calibration": None},
                }
                if baselines
                else {}
            ),
            "fitted_curve_without_family": {"prior": None, "calibration": part.curve},
            "own_curve_shipped_saw_family": {"prior": None, "calibration": shipped},
        }
        if refit:
            from services.estimator.model.owntrain import calibrate

            train_runs = [r for r in runs if owncorpus.family(r) != held]
            methods["own_curve_refit"] = {"prior": None, "calibration": calibrate(train_runs, list(metrics))}
        folds[held] = {"readings": part.readings, "methods": methods}
        print(f"family {held}: read", flush=True)
    rows: dict[str, dict[str, dict[str, dict[float, list[dict]]]]] = defaultdict(lambda: defaultdict(dict))
    for held in [f for f in families if not only or f in only]:
        others = ownnested.concat([v["readings"] for f, v in folds.items() if f != held])
        table, form = ownchoice.table_for(others)
        print(f"family {held}: the others chose {form}", flush=True)
        methods = folds[held]["methods"]
        methods[HEADLINE]["table"] = methods["blend_shipped_fit_saw_family"]["table"] = table
        methods["blend_fourth_round_form"]["table"] = ownnested.table_from(others)
        methods["blend_former_form"]["table"] = ownnested.former_table(others)
        for metric in metrics:
            test = owncorpus.cases([r for r in runs if owncorpus.family(r) == held], metric)
            for method, how in methods.items():
                rows[method][metric][held] = _rows(test, **how)
    report = _report(rows, families=families, runs=len(runs), paths=paths, refit=refit)
    report["power_fit"] = power_fit
    return report


def _calibration(path: Path) -> dict:
    """The fitted curve's file at `path`; a clear error where it cannot be read (a missing or hostile file)."""
    loaded = load_calibration(path)
    if loaded is None:
        raise ValueError(f"param[--calibration] invalid: cannot read a fitted curve from {path}")
    return loaded


def run_unseen_evaluation(
    paths: Iterable[Path] = owncorpus.UNSEEN,
    *,
    metrics: Sequence[str] = (HEADLINE_METRIC,),
    calibration_path: Path = CALIBRATION,
    table_path: Path = blendtable.TABLE,
) -> dict:
    """The estimator as shipped (the served prior with its pads, the shipped calibration, and their blend as the
    tracker serves it), scored on every run, all seeds, of families nothing shipped was fitted on: the second
    families file (`owncorpus.UNSEEN`; `owncorpus.TRAINED` excludes it). No fine-tuning: the figure a user of a new
    kind of training meets. `calibration_path`, `table_path`: another build's fitted curve and blend table
    (`ownbuild --curve-out`, `--out`) scored in place of the shipped ones."""
    runs = owncorpus.load_corpus(tuple(paths))
    if not runs:
        raise ValueError(f"param[--sweep] invalid: no runs in {paths}")
    trained = {owncorpus.family(r) for r in owncorpus.load_corpus(owncorpus.TRAINED)}
    seen = sorted({owncorpus.family(r) for r in runs} & trained)
    if seen:
        raise ValueError(f"param[--sweep] invalid: families {seen} are among those the shipped estimator was fitted on")
    prior = priornet.load(priornet.WEIGHTS)
    if prior is None:
        raise ValueError(f"cannot read the served prior {priornet.WEIGHTS}")
    shipped = _calibration(calibration_path)
    table = blendtable.load(table_path)
    if table is None:
        raise ValueError(f"param[--table] invalid: cannot read a blend table from {table_path}")
    methods: dict[str, dict[str, Any]] = {
        HEADLINE: {"prior": prior, "calibration": shipped, "blend": True, "table": table},
        "former_blend": {"prior": prior, "calibration": shipped, "blend": True},
        "curve_prior": {"prior": prior, "calibration": None},
        "own_curve_shipped": {"prior": None, "calibration": shipped},
    }
    families = sorted({owncorpus.family(r) for r in runs})
    rows: dict[str, dict[str, dict[str, dict[float, list[dict]]]]] = defaultdict(lambda: defaultdict(dict))
    for fam in families:
        test_runs = [r for r in runs if owncorpus.family(r) == fam]
        for metric in metrics:
            test = owncorpus.cases(test_runs, metric)
            for method, how in methods.items():
                rows[method][metric][fam] = _rows(test, **how)
    report = _report(rows, families=families, runs=len(runs), paths=paths, refit=False)
    report["split"] = "unseen"
    report["power_fit"] = shipped.get("power_fit", PLAIN)
    return report


def _report(
    rows: dict[str, dict[str, dict[str, dict[float, list[dict]]]]],
    *,
    families: list[str],
    runs: int,
    paths: Iterable[Path],
    refit: bool,
) -> dict:
    report: dict[str, Any] = {
        "corpus": "own-jobs",
        "split": "family",
        "sweep": ", ".join(str(p) for p in paths),
        "runs": runs,
        "families": families,
        "fit_seeds": list(FIT_SEEDS),
        "pad_seeds": list(PAD_SEEDS),
        "headline_method": HEADLINE,
        "headline_metric": HEADLINE_METRIC,
        "refit_baseline": refit,
        "cuts": [f"{int(c * 100)}%" for c in owncorpus.CUTS],
        "methods": {},
    }
    for method, by_metric in rows.items():
        entry: dict[str, Any] = {}
        for metric, by_family in by_metric.items():
            for cut in owncorpus.CUTS:
                key = f"{int(cut * 100)}%"
                pooled = [r for fam in by_family.values() for r in fam[cut]]
                entry.setdefault(metric, {}).setdefault("all", {})[key] = _summary(pooled)
                for fam, by_cut in by_family.items():
                    entry[metric].setdefault(fam, {})[key] = _summary(by_cut[cut])
        report["methods"][method] = entry
    return report


def print_family_table(report: dict) -> None:
    if report["split"] == "unseen":
        print(
            f"own-jobs corpus, families the shipped estimator never saw: {report['runs']} runs, families "
            f"{report['families']}; the served prior and calibration as shipped, every seed scored"
        )
    else:
        print(
            f"own-jobs corpus, leave-one-family-out: {report['runs']} runs, families {report['families']}; "
            f"fine-tuned on seeds {report['fit_seeds']}, pads from seeds {report['pad_seeds']} of the other "
            "families"
        )
    for method, entry in report["methods"].items():
        for metric, by_family in entry.items():
            print(
                f"\n{method}{' (headline)' if method == report['headline_method'] else ''}, {metric}: "
                "within ±20% (10-90% coverage) at " + " / ".join(report["cuts"])
            )
            for fam, by_cut in by_family.items():
                cells = [
                    f"{s['within_20pct'] * 100:5.1f}% ({s.get('coverage_10_90', float('nan')) * 100:5.1f}%)"
                    for s in by_cut.values()
                ]
                n = next(iter(by_cut.values()))["n_total"]
                print(f"  {fam:>14} n={n:<4} " + "  ".join(cells))
