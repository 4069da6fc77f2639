"""History predictor: an MLP (design Fig. 3) from job features to work and duration to target."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.estimator.model import evalunits
from services.estimator.model.corpus import Run
from services.estimator.model.evalunits import EvalUnits
from services.estimator.model.features import (
    CATEGORICAL,
    NUMERIC,
    JobFeatures,
    categorical_values,
    compute_tflops,
    features_from_run,
    numeric_values,
)

# numpy weights and JSON state in one .npz (2: a torch file; 3: no bandwidths, no eval units; 4: an unseen
# benchmark started from its task's or family's offset, its calibration fitted so: refused, and retrained)
FORMAT_VERSION = 5
UNSEEN_ACCELERATOR = "<unseen>"  # encodes as the vocabulary's <unk>
# Calibration and band key of a benchmark the model was never trained on: its figures are learned by leaving
# each training benchmark out in turn (calibrate.train_with_calibration), not borrowed from seen ones.
UNSEEN = "<unseen>"
# Without leave-one-benchmark-out residuals, an unseen benchmark's band is the pooled one widened this much (log).
UNSEEN_WIDEN = 3.0
# The network's log outputs are kept within the trained range widened by this (log): an input unlike any
# trained on (a new benchmark's batch size, say) must not extrapolate to infinity.
LOG_MARGIN = 2.0
# Interval quantiles: the service reports a 10-90% band.
Q_LOW, Q_HIGH = 0.10, 0.90


@dataclass(frozen=True)
class HistoryPrior:
    """History prediction for one job: total work and duration with 10-90% bands."""

    duration_s: float
    duration_low_s: float
    duration_high_s: float
    work: float
    work_low: float
    work_high: float
    benchmark: str = "unknown"
    seen: bool = True  # False: the model never trained on this benchmark (bands from held-out benchmarks)
    # Work to target in multiples of the job's own first evaluation, learned across the training benchmarks.
    eval_units: EvalUnits | None = None


# Work to target is a property of the algorithm and its hyper-parameters, not of the
# hardware: the work head sees only these inputs, which stops it learning spurious
# accelerator effects from a few submitters. The duration head sees everything, and it
# predicts a cost per unit of work per peak TFLOPS (log seconds x TFLOPS / work), not the
# duration itself: duration = work x cost / TFLOPS. Scale is then physics, not something the
# network must extrapolate to a system four times larger than any it was shown; what it
# learns is how far a system falls short of its peak (interconnect, software, small batches).
WORK_INPUTS = ("benchmark", "task", "family", "batch_size", "learning_rate")


def forward(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """historynet.MLP's forward pass on numpy: [log work, log unit cost] per row of `x`."""

    def layer(name: str, h: np.ndarray) -> np.ndarray:
        return h @ weights[f"{name}.weight"].T + weights[f"{name}.bias"]

    relu = lambda h: np.maximum(h, 0.0)  # noqa: E731
    work = layer("work.2", relu(layer("work.0", x * weights["work_mask"])))
    duration = layer("duration.4", relu(layer("duration.2", relu(layer("duration.0", x)))))
    return np.concatenate([work, duration], axis=1)


class HistoryPredictor:
    """Predicts log work and log duration to target; residual quantiles give the bands."""

    def __init__(self, *, hidden: int = 64, epochs: int = 400, seed: int = 0) -> None:
        self.hidden, self.epochs, self.seed = hidden, epochs, seed
        self.vocab: dict[str, list[str]] = {}
        self.offsets: dict[str, tuple[float, float]] = {}  # benchmark -> mean log work, duration
        self.x_mean: np.ndarray = np.zeros(0, np.float32)  # the inputs' scaling, set by fitting or loading
        self.x_std: np.ndarray = np.ones(0, np.float32)
        self.quantiles: dict[str, tuple[float, ...]] = {}  # benchmark -> work q10,q90, dur q10,q90
        self.blend: dict = {}  # filled by calibrate.train_with_calibration; saved with the model
        self.work_table: dict[str, float] = {}  # "benchmark|batch" -> median work seen
        self.duration_table: dict[str, float] = {}  # "benchmark|accel|count|batch" -> median s
        self.log_range: list[list[float]] | None = None  # [[lo, hi] log work, [lo, hi] log unit cost]
        self.weights: dict[str, np.ndarray] = {}  # the network's, by state_dict name (none before fitting)
        self.eval_units: EvalUnits | None = None  # total / first-evaluation work across benchmarks

    # -- encoding -----------------------------------------------------------------------
    def _encode(self, feats: list[JobFeatures]) -> np.ndarray:
        rows = []
        for f in feats:
            cats = categorical_values(f)
            row = []
            for name in CATEGORICAL:
                words = self.vocab[name]
                one_hot = [0.0] * len(words)
                one_hot[words.index(cats[name]) if cats[name] in words else 0] = 1.0
                row += one_hot
            rows.append(row + numeric_values(f))
        x = np.asarray(rows, dtype=np.float32)
        return (x - self.x_mean) / self.x_std

    def _offset(self, feat: JobFeatures) -> tuple[float, float]:
        """Mean log work and unit cost of the benchmark; of every training run when it was never trained on.

        Not its task's or family's: a family word shares a benchmark's units no more than any other (bert held out
        of v3.1 took gpt3's, the only other transformer, and came out ~200x long); on v3.1's benchmarks held out
        three at a time the pooled mean was within ±20% at 10/20/30/50/80% of a run on 14.3 / 10.5 / 17.7 / 37.9 /
        45.4% against 2.2 / 5.9 / 18.9 / 26.9 / 50.2%, its band covering 56-80% against 23-78%. The task and family
        words still reach the network's inputs."""
        return self.offsets.get(feat.benchmark, self.offsets["*"])

    def seen(self, benchmark: str) -> bool:
        """Whether the model was trained on this benchmark."""
        return benchmark in self.offsets and benchmark != "*"

    # -- training -----------------------------------------------------------------------
    def train(self, runs: Sequence[Run], *, folds: int = 3) -> HistoryPredictor:
        """Fit on corpus runs; out-of-fold residuals by submitter calibrate the bands."""
        runs = [r for r in runs if r.total_work is not None]  # a run that never showed its work cannot be fitted
        feats = [features_from_run(r) for r in runs]
        y = np.log([[work, r.duration_s] for r in runs if (work := r.total_work) is not None])
        cost = _unit_cost(feats, y)
        groups = [r.submitter for r in runs]
        resid = self._oof_residuals(feats, y, cost, groups, folds) if folds > 1 else None
        self._fit(feats, cost)
        self.work_table = _work_table(feats, y[:, 0])
        self.duration_table = _duration_table(feats, y[:, 1])
        self.eval_units = evalunits.learn(runs)
        if resid is None:
            resid = y - np.log(np.array([self._predict_raw(f) for f in feats]))
        self._set_quantiles([f.benchmark for f in feats], resid)
        return self

    def _oof_residuals(
        self, feats: list[JobFeatures], y: np.ndarray, cost: np.ndarray, groups: list[str], folds: int
    ) -> np.ndarray:
        names = sorted(set(groups))
        rng = np.random.default_rng(self.seed)
        rng.shuffle(names)
        fold_of = {g: i % folds for i, g in enumerate(names)}
        resid = np.zeros_like(y)
        for k in range(folds):
            test = np.array([fold_of[g] == k for g in groups])
            if test.all() or not test.any():
                continue
            part = HistoryPredictor(hidden=self.hidden, epochs=self.epochs, seed=self.seed)
            part._fit([f for f, t in zip(feats, test) if not t], cost[~test])
            seen = [f for f, t in zip(feats, test) if not t]
            part.work_table = _work_table(seen, y[~test, 0])
            part.duration_table = _duration_table(seen, y[~test, 1])
            pred = np.log([part._predict_raw(f) for f, t in zip(feats, test) if t])
            resid[test] = y[test] - pred
        return resid

    def _fit(self, feats: list[JobFeatures], y: np.ndarray) -> None:
        from services.estimator.model import historynet  # torch: only where a model is trained

        cats = [categorical_values(f) for f in feats]
        self.vocab = {n: ["<unk>"] + sorted({c[n] for c in cats}) for n in CATEGORICAL}
        self.offsets = {"*": _pair(y.mean(axis=0))}
        names = [f.benchmark for f in feats]
        for b in set(names):
            mask = np.array([x == b for x in names])
            self.offsets[b] = _pair(y[mask].mean(axis=0))
        self.log_range = [[float(y[:, i].min()) - LOG_MARGIN, float(y[:, i].max()) + LOG_MARGIN] for i in (0, 1)]
        # Every run is shown twice, the second time with its accelerator unknown: a model of a
        # held-out accelerator (a new GPU, a submitter's own) then falls back on its TFLOPS, not
        # on whatever an untrained one-hot column happens to add.
        unseen = [dataclasses.replace(f, accelerator=UNSEEN_ACCELERATOR) for f in feats]
        self.x_mean, self.x_std = np.zeros(1, np.float32), np.ones(1, np.float32)
        raw = self._encode(feats + unseen)
        self.x_mean = raw.mean(axis=0)
        self.x_std = raw.std(axis=0) + 1e-6
        x = self._encode(feats + unseen)
        target = y - np.array([self._offset(f) for f in feats])
        self.weights = historynet.fit(
            x,
            np.concatenate([target, target]),
            hidden=self.hidden,
            work_mask=self._work_mask(),
            epochs=self.epochs,
            seed=self.seed,
        )

    def _work_mask(self) -> list[float]:
        mask = []
        for name in CATEGORICAL:
            mask += [1.0 if name in WORK_INPUTS else 0.0] * len(self.vocab[name])
        return mask + [1.0 if name in WORK_INPUTS else 0.0 for name in NUMERIC]

    def _set_quantiles(self, benches: list[str], resid: np.ndarray) -> None:
        self.quantiles = {"*": quantile_row(resid)}
        for b in set(benches):
            mask = np.array([x == b for x in benches])
            if mask.sum() >= 10:
                self.quantiles[b] = quantile_row(resid[mask])

    # -- prediction ---------------------------------------------------------------------
    def _predict_raw(self, feat: JobFeatures) -> tuple[float, float]:
        return self._predict_many([feat])[0]

    def _predict_many(self, feats: list[JobFeatures]) -> list[tuple[float, float]]:
        out = forward(self.weights, self._encode(feats))
        logs = out + np.array([self._offset(f) for f in feats])
        if self.log_range is not None:
            logs = np.clip(logs, [r[0] for r in self.log_range], [r[1] for r in self.log_range])
        preds = [tuple(float(v) for v in np.exp(row)) for row in logs]  # work, unit cost
        # Where the same benchmark ran with the same batch size often enough, the median work
        # of those runs beats the network (checked on submitter-held-out splits).
        # With no such runs, the network is shrunk halfway (in log) to the benchmark median:
        # batch-size extrapolation by the network is noisy for unseen batch sizes.
        result = []
        for f, (w, cost) in zip(feats, preds):
            bench = self.work_table.get(f"{f.benchmark}|*")
            shrunk = math.sqrt(w * bench) if bench else w
            work = self.work_table.get(_work_key(f), shrunk)
            # The same system configuration seen often enough: its median duration.
            result.append((work, self.duration_table.get(_duration_key(f), work * cost / compute_tflops(f))))
        return result

    def prior(self, features: JobFeatures) -> HistoryPrior:
        """Work and duration to target, each with its 10-90% band."""
        feat = features.resolved()
        work, dur = self._predict_raw(feat)
        seen = self.seen(feat.benchmark)
        if seen:
            wq_lo, wq_hi, dq_lo, dq_hi = self.quantiles.get(feat.benchmark, self.quantiles["*"])
        elif UNSEEN in self.quantiles:
            wq_lo, wq_hi, dq_lo, dq_hi = self.quantiles[UNSEEN]
        else:
            wq_lo, wq_hi, dq_lo, dq_hi = (UNSEEN_WIDEN * q for q in self.quantiles["*"])
        if not seen:  # biased on benchmarks it never saw: the band is theirs, the point stays inside it
            wq_lo, dq_lo, wq_hi, dq_hi = min(wq_lo, 0.0), min(dq_lo, 0.0), max(wq_hi, 0.0), max(dq_hi, 0.0)
        return HistoryPrior(
            duration_s=dur,
            duration_low_s=dur * math.exp(dq_lo),
            duration_high_s=dur * math.exp(dq_hi),
            work=work,
            work_low=work * math.exp(wq_lo),
            work_high=work * math.exp(wq_hi),
            benchmark=feat.benchmark,
            seen=seen,
            eval_units=self.eval_units,
        )

    def predict(self, features: JobFeatures) -> tuple[float, float, float]:
        """(duration_s, low_s, high_s) before the job starts."""
        p = self.prior(features)
        return p.duration_s, p.duration_low_s, p.duration_high_s

    # -- persistence --------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "hidden": self.hidden,
            "epochs": self.epochs,
            "seed": self.seed,
            "vocab": self.vocab,
            "offsets": self.offsets,
            "x_mean": self.x_mean.tolist(),
            "x_std": self.x_std.tolist(),
            "quantiles": self.quantiles,
            "blend": self.blend,
            "work_table": self.work_table,
            "duration_table": self.duration_table,
            "log_range": self.log_range,
            "eval_units": self.eval_units.to_state() if self.eval_units else None,
        }

    def save(self, path: str | Path) -> None:
        """Write the weights, vocabulary, calibration and format version to one .npz file (numpy only)."""
        with open(path, "wb") as f:
            arrays: dict[str, Any] = {"state": np.array(json.dumps(self.state()))}
            arrays.update({f"w:{k}": v for k, v in self.weights.items()})
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> HistoryPredictor:
        try:
            with np.load(io.BytesIO(Path(path).read_bytes()), allow_pickle=False) as stored:
                state = json.loads(str(stored["state"])) if "state" in stored.files else {}
                weights = {k[2:]: stored[k] for k in stored.files if k.startswith("w:")}
        except (ValueError, OSError) as exc:
            raise ValueError(f"not a history model: {exc}") from exc
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported history model format {state.get('format_version')}")
        self = cls(hidden=state["hidden"], epochs=state["epochs"], seed=state["seed"])
        self.vocab, self.offsets = state["vocab"], {k: _pair(v) for k, v in state["offsets"].items()}
        self.x_mean = np.asarray(state["x_mean"], np.float32)
        self.x_std = np.asarray(state["x_std"], np.float32)
        self.quantiles = {k: tuple(v) for k, v in state["quantiles"].items()}
        self.blend = state["blend"]
        self.work_table = state["work_table"]
        self.duration_table = state["duration_table"]
        self.log_range = state.get("log_range")  # absent from models saved before it existed
        self.eval_units = EvalUnits.from_state(state.get("eval_units"))
        self.weights = weights
        return self


MIN_RUNS_FOR_TABLE = 5


def quantile_row(resid: np.ndarray) -> tuple[float, ...]:
    """(work q10, work q90, duration q10, duration q90) of log residual rows [work, duration]."""
    return tuple(float(v) for v in np.quantile(resid, [Q_LOW, Q_HIGH], axis=0).T.ravel())


def _unit_cost(feats: list[JobFeatures], y: np.ndarray) -> np.ndarray:
    """[log work, log duration] -> [log work, log(duration x total TFLOPS / work)]."""
    out = y.copy()
    out[:, 1] = y[:, 1] - y[:, 0] + np.log([compute_tflops(f) for f in feats])
    return out


def _work_key(feat: JobFeatures) -> str:
    return f"{feat.benchmark}|{feat.batch_size:g}"


def _work_table(feats: list[JobFeatures], log_work: np.ndarray) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for f, w in zip(feats, log_work):
        groups.setdefault(_work_key(f), []).append(float(w))
        groups.setdefault(f"{f.benchmark}|*", []).append(float(w))
    return {k: float(np.exp(np.median(v))) for k, v in groups.items() if len(v) >= MIN_RUNS_FOR_TABLE}


def _duration_key(feat: JobFeatures) -> str:
    accel = categorical_values(feat)["accelerator"]
    return f"{feat.benchmark}|{accel}|{feat.accelerators}|{feat.batch_size:g}"


def _duration_table(feats: list[JobFeatures], log_duration: np.ndarray) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for f, d in zip(feats, log_duration):
        groups.setdefault(_duration_key(f), []).append(float(d))
    return {k: float(np.exp(np.median(v))) for k, v in groups.items() if len(v) >= MIN_RUNS_FOR_TABLE}


def _pair(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Mean log work and log unit cost, as two floats."""
    return float(values[0]), float(values[1])
