"""Leave-one-family-out readings of the own-job ETA's two parts, for the blend table (offline; torch).

For each recorded family, the curve prior fine-tuned without it (`ownfamily`'s fold, mixed with the synthetic prior
and padded on the other families' seeds 3-4, as served) and the fitted curve's calibration fitted without it (what
`owncurve.json` holds, by the same `owntrain.calibration_from`: four networks cross-fitted on the other families'
seeds 0-3 and their pads) read every case of that family: neither part has seen it. The blend table
(`curveprior.blendtable`) is fitted on those readings, so the weight it gives the fitted curve is the weight it earns
on a family it never saw, not on the ones it was fitted on. The same build writes the shipped `owncurve.json`,
fitted on every family's samples.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import blendtable
from services.estimator.model.curveprior.estimate import prior_estimate
from services.estimator.model.curveprior.net import PRETRAINED, PriorNet, load as load_prior
from services.estimator.model.forked import in_processes
from services.estimator.model.owncurve import FEATURES, PLAIN, SEEN_EDGES, own_estimate
from services.estimator.shipped import code_digest

if TYPE_CHECKING:
    from services.estimator.model.owntrain import SeedSamples

FIT_SEEDS = (0, 1, 2)  # the prior's fine-tuning (as `ownfamily`)
PAD_SEEDS = (3, 4)  # its pads
CURVE_METRICS = list(owncorpus.METRICS)  # what the fitted curve's networks are fitted on (as `bench.search.calibrate`)
ROW_U = owncorpus.CALIBRATION_U
ROW_METRICS = tuple(owncorpus.METRICS)


@dataclass(frozen=True)
class Readings:
    """Per (case, cut) where both parts read: family, prior and fitted readings (n, 3), log(true total/elapsed)."""

    families: list[str]
    prior: np.ndarray
    fitted: np.ndarray
    truth: np.ndarray

    def where(self, keep: np.ndarray) -> Readings:
        return Readings(
            [f for f, k in zip(self.families, keep) if k], self.prior[keep], self.fitted[keep], self.truth[keep]
        )


@dataclass(frozen=True)
class Fold:
    """What was built without one family: the fine-tuned prior, the prior as served (mixed, padded), the pads'
    samples, the fitted-curve calibration, and the readings of the family's cases by both."""

    tuned: PriorNet
    prior: PriorNet
    pads: tuple[np.ndarray, np.ndarray]
    curve: dict
    readings: Readings


def fold(
    runs: list[dict],
    *,
    held: str,
    pretrained: PriorNet,
    samples: dict[str, SeedSamples],
    cache_dir: Path | None,
    encoded: dict[str, Encoded] | None = None,
    power_fit: str = PLAIN,
) -> Fold:
    """The parts built without the family `held`, and their readings of its cases (`encoded`: every family's
    samples encoded once, `prior_samples`; the readings and the fitted curve cached in `cache_dir` with the
    fine-tuned prior, by what they were built from; `samples` made with `power_fit`, `curve_samples`)."""
    from services.estimator.model.curveprior import train  # torch

    train_runs = [r for r in runs if owncorpus.family(r) != held]
    test_runs = [r for r in runs if owncorpus.family(r) == held]
    own = encoded if encoded is not None else prior_samples(train_runs)
    others = [v for f, v in sorted(own.items()) if f != held]
    pads = (np.concatenate([v.pad_x for v in others]), np.concatenate([v.pad_r for v in others]))
    tune = (np.concatenate([v.tune_x for v in others]), np.concatenate([v.tune_y for v in others]))
    key = cache_key(train_runs)
    tuned = tuned_without(train, pretrained, tune, key=key, held=held, cache_dir=cache_dir)
    served = train.mixed(tuned, pretrained)
    padded = cached_json(
        cache_dir, f"pads-without-{held}-{key}.json", lambda: [list(p) for p in train.with_pads(served, pads).pads]
    )
    prior = PriorNet(
        served.layers, served.mean, served.std, tuple(SEEN_EDGES), tuple((a, b) for a, b in padded), served.mixed
    )
    curve = cached_json(
        cache_dir,
        f"calibration-without-{held}-{cache_key(train_runs, power_fit)}.json",
        lambda: fold_curve(samples, held=held, runs=train_runs, power_fit=power_fit),
    )
    read_key = cache_key(test_runs, key, power_fit)
    path = cache_dir / f"readings-{held}-{read_key}.npz" if cache_dir else None
    readings = load_readings(path) if path is not None and path.exists() else None
    if readings is None:
        readings = read(row_cases(test_runs), prior=prior, calibration=curve)
        if path is not None:
            save_readings(readings, path)
    return Fold(tuned, prior, pads, curve, readings)


@dataclass(frozen=True)
class Encoded:
    """One family's samples, encoded once for every fold that trains on it: the prior's fine-tuning inputs and
    truth bins (seeds FIT_SEEDS), and its pads' inputs and truth log ratios (seeds PAD_SEEDS)."""

    tune_x: np.ndarray
    tune_y: np.ndarray
    pad_x: np.ndarray
    pad_r: np.ndarray


def prior_samples(runs: list[dict], cache_dir: Path | None = None, *, jobs: int = 1) -> dict[str, Encoded]:
    """`Encoded` per family of `runs` (a fold concatenates the other families'), cached in `cache_dir`."""
    from services.estimator.model.curveprior import train  # torch

    def make(own: list[dict]) -> Encoded:
        x, y, _ = train.recorded(train.training_cases(own, FIT_SEEDS))
        return Encoded(x, y, *train.pad_samples(train.pad_cases(own, PAD_SEEDS)))

    return per_family(
        runs,
        cache_dir,
        kind="encoded",
        make=make,
        to_arrays=vars,
        from_arrays=lambda raw: Encoded(**dict(raw)),
        jobs=jobs,
    )


T = TypeVar("T")


def per_family(
    runs: list[dict],
    cache_dir: Path | None,
    *,
    kind: str,
    make: Callable[[list[dict]], T],
    to_arrays: Callable[[T], dict[str, Any]],
    from_arrays: Callable[[Mapping[str, np.ndarray]], T],
    jobs: int = 1,
) -> dict[str, T]:
    """`make` of each family's runs of `runs`, by family (the families not cached in up to `jobs` processes,
    `in_processes`); cached in `cache_dir` as `kind`'s arrays, keyed by the family's runs and the recipe."""
    out: dict[str, T] = {}
    missing: dict[str, Path | None] = {}
    for fam in sorted({owncorpus.family(r) for r in runs}):
        own = [r for r in runs if owncorpus.family(r) == fam]
        path = cache_dir / f"{kind}-{fam}-{cache_key(own, kind)}.npz" if cache_dir else None
        if path is not None and path.exists():
            with np.load(path) as raw:
                out[fam] = from_arrays(raw)
        else:
            missing[fam] = path
    made = in_processes(lambda fam: make([r for r in runs if owncorpus.family(r) == fam]), list(missing), jobs=jobs)
    for (fam, path), got in zip(missing.items(), made):
        out[fam] = got
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, **to_arrays(got))
    return dict(sorted(out.items()))


CACHE_VERSION = "3"  # bumped when what a cached fold is made of changes
# What a fold's parts and readings are made by (the fitted curve's training, features and cuts, the prior's
# fine-tuning, encoding and reading): a change to one of these files, or to a constant `recipe` names, is another
# recipe, and every fold cached under the former one is left unread.
RECIPE_SOURCES = (
    "services/estimator/model/owntrain.py",
    "services/estimator/model/owncurve.py",
    "services/estimator/model/owncorpus.py",
    "services/estimator/model/curves.py",
    "services/estimator/model/curveprior/train.py",
    "services/estimator/model/curveprior/encode.py",
    "services/estimator/model/curveprior/net.py",
    "services/estimator/model/curveprior/estimate.py",
    "services/estimator/model/curveprior/sampler.py",
    "services/estimator/model/curveprior/noise.py",
)


def recipe() -> str:
    """The digest of how a fold is built: `RECIPE_SOURCES` and the constants they are run with (torch)."""
    from services.estimator.model import owntrain

    constants = (
        owntrain.STEPS,
        owntrain.HIDDEN,
        owntrain.QUANTILES,
        owntrain.MIN_PAD_SAMPLES,
        owntrain.PAD_METRICS,
        FEATURES,
        SEEN_EDGES,
        owncorpus.CALIBRATION_CUTS,
        owncorpus.CALIBRATION_U,
        owncorpus.PAD_CUTS,
        owncorpus.PAD_U,
        owncorpus.HELD_OUT_SEEDS,
        FIT_SEEDS,
        PAD_SEEDS,
        CURVE_METRICS,
        ROW_U,
        ROW_METRICS,
    )
    return code_digest(list(RECIPE_SOURCES)) + json.dumps(constants)


def cache_key(runs: list[dict], *more: str) -> str:
    """The cache key of what `runs` make by the current `recipe` (and `more`), with the pre-trained prior."""
    digest = hashlib.sha256(PRETRAINED.read_bytes())
    digest.update(json.dumps([CACHE_VERSION, recipe(), sorted(r["run"] for r in runs), *more]).encode())
    return digest.hexdigest()[:16]


def cached_json(cache_dir: Path | None, name: str, make: Callable[[], Any]) -> Any:
    path = cache_dir / name if cache_dir else None
    if path is not None and path.exists():
        return json.loads(path.read_text())
    value = make()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return value


def save_readings(readings: Readings, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        path,
        families=np.asarray(readings.families, str),
        prior=readings.prior,
        fitted=readings.fitted,
        truth=readings.truth,
    )


def load_readings(path: Path) -> Readings | None:
    try:
        with np.load(path) as raw:
            return Readings([str(f) for f in raw["families"]], raw["prior"], raw["fitted"], raw["truth"])
    except (OSError, ValueError, KeyError):
        return None


def tuned_without(
    train: ModuleType,
    pretrained: PriorNet,
    samples: tuple[np.ndarray, np.ndarray],
    *,
    key: str,
    held: str,
    cache_dir: Path | None,
) -> PriorNet:
    """The prior fine-tuned on the samples of every family but `held` (cached by `key`, the pre-trained file's and
    the training runs' digest: a re-run does not fine-tune again)."""
    path = cache_dir / f"curveprior-without-{held}-{key}.npz" if cache_dir else None
    if path is not None and (cached := load_prior(path)) is not None:
        return cached
    tuned = train.finetune_samples(pretrained, *samples)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tuned.save(path)
    return tuned


def curve_samples(
    runs: list[dict], cache_dir: Path | None = None, *, jobs: int = 1, power_fit: str = PLAIN
) -> dict[str, SeedSamples]:
    """The fitted curve's samples by seed (`owntrain.seed_samples`: its networks' and its pads', the power law
    fitted by `power_fit`) per family (cached in `cache_dir`)."""
    from services.estimator.model.owntrain import seed_samples  # torch

    return per_family(
        runs,
        cache_dir,
        kind="curve-seeds" if power_fit == PLAIN else f"curve-seeds-{power_fit}",
        make=lambda own: seed_samples(own, CURVE_METRICS, power_fit=power_fit),
        to_arrays=_seed_arrays,
        from_arrays=_seeds_from,
        jobs=jobs,
    )


def _seed_arrays(samples: SeedSamples) -> dict[str, Any]:
    arrays: dict[str, Any] = {
        f"{part}_{axis}_{seed}": xy[i]
        for part, by_seed in (("fit", samples.fit), ("pad", samples.pad))
        for seed, xy in by_seed.items()
        for i, axis in enumerate("xy")
    }
    return arrays | {"pad_cases": np.asarray(samples.pad_cases)}


def _seeds_from(raw: Mapping[str, np.ndarray]) -> SeedSamples:
    from services.estimator.model.owntrain import SeedSamples  # torch

    by = {
        part: {int(k.split("_")[2]): (raw[k], raw[k.replace("_x_", "_y_")]) for k in raw if k.startswith(f"{part}_x_")}
        for part in ("fit", "pad")
    }
    return SeedSamples(by["fit"], by["pad"], int(raw["pad_cases"]))


def fold_curve(samples: dict[str, SeedSamples], *, held: str, runs: list[dict], power_fit: str = PLAIN) -> dict:
    """The fitted curve's calibration as shipped (`owntrain.calibration_from`) from every family's samples but
    `held`'s (`runs`: the other families' runs; `power_fit`: what the samples were made with)."""
    from services.estimator.model.owntrain import calibration_from, merged

    others = merged([v for f, v in sorted(samples.items()) if f != held])
    return calibration_from(others, runs=runs, metrics=CURVE_METRICS, power_fit=power_fit)


def shipped_curve(samples: dict[str, SeedSamples], *, runs: list[dict], jobs: int = 1, power_fit: str = PLAIN) -> dict:
    """The calibration `owncurve.json` ships: fitted on every family's samples (as `bench.search.calibrate`), its
    networks in up to `jobs` processes (`power_fit`: what the samples were made with)."""
    from services.estimator.model.owntrain import calibration_from, merged

    others = merged([v for _, v in sorted(samples.items())])
    return calibration_from(others, runs=runs, metrics=CURVE_METRICS, jobs=jobs, power_fit=power_fit)


def read(
    cases: Iterable[owncorpus.Case], *, prior: PriorNet, calibration: dict, cuts: Sequence[float] = owncorpus.PAD_CUTS
) -> Readings:
    """Both parts' readings of every case at every cut where both read and the target is not yet met."""
    families, p_rows, f_rows, truths = [], [], [], []
    for case in cases:
        for cut in cuts:
            now = cut * case.truth
            ts, xs, values = owncorpus.prefix(case, now)
            p = prior_estimate(ts, xs, values, target=case.target, mode=case.mode, elapsed=now, prior=prior)
            f = own_estimate(ts, xs, values, target=case.target, mode=case.mode, elapsed=now, calibration=calibration)
            if p is None or f is None or "reached" in (p.kind, f.kind) or now <= 0:
                continue
            families.append(case.family)
            p_rows.append(blendtable.reading(p.total_s, p.low_s, p.high_s, elapsed=now))
            f_rows.append(blendtable.reading(f.total_s, f.low_s, f.high_s, elapsed=now))
            truths.append(math.log(case.truth / now))
    return Readings(
        families, np.asarray(p_rows, float).reshape(-1, 3), np.asarray(f_rows, float).reshape(-1, 3), np.asarray(truths)
    )


def row_cases(runs: list[dict]) -> list[owncorpus.Case]:
    """The cases the table is fitted on: every metric, targets at ROW_U, the loss printed raw and as a mean."""
    return [c for m in ROW_METRICS for c in owncorpus.cases(runs, m, us=ROW_U, smooths=(False, True))]


def concat(parts: Sequence[Readings]) -> Readings:
    return Readings(
        [f for p in parts for f in p.families],
        np.concatenate([p.prior for p in parts]),
        np.concatenate([p.fitted for p in parts]),
        np.concatenate([p.truth for p in parts]),
    )


def table_from(readings: Readings) -> blendtable.BlendTable | None:
    """The table fitted on `readings`; None (the former fixed blend) when they are too few to fit one."""
    if len(readings.truth) < blendtable.MIN_ROWS:
        return None
    return blendtable.fit_table(readings.prior, readings.fitted, readings.truth, readings.families)


# The table's form before the eleven-family split (one cell, the first spread, the prior's share 0.25-0.75): the
# split's "before" (`ownfamily`'s `blend_former_form`).
FORMER_FORM: dict[str, Any] = {"edges": (), "spread": (1.0, 0.5, 0.0), "weights": (0.25, 0.375, 0.5, 0.625, 0.75)}


def former_table(readings: Readings) -> blendtable.BlendTable | None:
    """`table_from` in the table's former form (`FORMER_FORM`)."""
    if len(readings.truth) < blendtable.MIN_ROWS:
        return None
    return blendtable.fit_table(readings.prior, readings.fitted, readings.truth, readings.families, **FORMER_FORM)


def nested_readings(
    runs: list[dict],
    *,
    pretrained: PriorNet,
    samples: dict[str, SeedSamples],
    encoded: dict[str, Encoded],
    cache_dir: Path | None,
    jobs: int = 1,
    power_fit: str = PLAIN,
) -> Readings:
    """Every family's readings by the parts built without it (`fold`), the folds in up to `jobs` processes
    (`samples` made with `power_fit`)."""

    def part(held: str) -> Readings:
        got = fold(
            runs,
            held=held,
            pretrained=pretrained,
            samples=samples,
            cache_dir=cache_dir,
            encoded=encoded,
            power_fit=power_fit,
        )
        print(f"family {held}: {len(got.readings.truth)} readings", flush=True)
        return got.readings

    if jobs > 1:
        before_forking()
    return concat(in_processes(part, sorted({owncorpus.family(r) for r in runs}), jobs=jobs))


def before_forking() -> None:
    """What every fold's fine-tuning draws alike (`train.finetune_samples`' fresh synthetic curves), drawn once
    here so that forked folds inherit it rather than each drawing it again."""
    from services.estimator.model.curveprior import train  # torch

    train.synthetic_mix()
