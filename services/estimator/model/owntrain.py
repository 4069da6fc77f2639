"""Training of the own-job ETA's quantile networks on the recorded corpus (offline; torch).

Only the calibration split is used (seeds not in `owncorpus.HELD_OUT_SEEDS`), cross-fitted by seed: each network
is fitted on all seeds but one and scored on that one; the conformal pads that make the ensemble's 10-90% band
cover 80% come from those out-of-fold scores.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from services.estimator.model import owncorpus
from services.estimator.model.forked import in_processes
from services.estimator.model.owncurve import FEATURES, PLAIN, SEEN_EDGES

QUANTILES = (0.1, 0.5, 0.9)
HIDDEN = 24
STEPS = 1500
MIN_PAD_SAMPLES = 100
PAD_METRICS = ("loss",)  # the band is sized on what a script prints, its training loss


def fit_net(
    x: np.ndarray, y: np.ndarray, *, seed: int = 0, hidden: int = HIDDEN, steps: int = STEPS, weight_decay: float = 1e-4
) -> dict:
    """A 2-layer MLP giving (median, log-gap down, log-gap up), trained with the pinball loss; as JSON lists."""
    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)
    net = nn.Sequential(
        nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 3)
    )
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for _ in range(steps):
        out = net(xt)
        mid = out[:, 0]
        qs = (mid - nn.functional.softplus(out[:, 1]), mid, mid + nn.functional.softplus(out[:, 2]))
        loss = sum(
            (torch.mean(torch.maximum(q * (yt - pred), (q - 1) * (yt - pred))) for q, pred in zip(QUANTILES, qs)),
            torch.zeros(()),
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    layers = [m for m in net if isinstance(m, nn.Linear)]
    return {
        "mean": mean.round(6).tolist(),
        "std": std.round(6).tolist(),
        "layers": [
            [np.round(m.weight.detach().numpy(), 5).tolist(), np.round(m.bias.detach().numpy(), 5).tolist()]
            for m in layers
        ],
    }


def conformal_pads(q: np.ndarray, y: np.ndarray, *, miss: float = 0.1) -> list[list[float]]:
    """(down, up) pads per bin of the fraction of the training seen (`SEEN_EDGES`, from the median `q[:, 1]`), in
    log units, so that the band misses `miss` of held-out samples below and as many above (conformalised quantile
    regression, one side at a time; a bin with too few samples takes the pads of all)."""
    bins = np.searchsorted(SEEN_EDGES, np.exp(-q[:, 1]), side="right")

    def pads(mask: np.ndarray) -> list[float]:
        level = min(1.0, (1 - miss) * (1 + 1 / mask.sum()))
        return [
            round(float(np.quantile(q[mask, 0] - y[mask], level)), 4),
            round(float(np.quantile(y[mask] - q[mask, 2], level)), 4),
        ]

    overall = pads(np.ones(len(y), bool))
    return [pads(bins == b) if np.sum(bins == b) >= MIN_PAD_SAMPLES else overall for b in range(len(SEEN_EDGES) + 1)]


@dataclass(frozen=True)
class SeedSamples:
    """Samples by seed: the networks' (features, log ratio to the truth) at the calibration cuts, and the pads' at
    their finer cuts on their targets (`pad_cases`: how many cases those came from)."""

    fit: dict[int, tuple[np.ndarray, np.ndarray]]
    pad: dict[int, tuple[np.ndarray, np.ndarray]]
    pad_cases: int


def seed_samples(
    runs: list[dict], metrics: Sequence[str], *, pad_metrics: Sequence[str] = PAD_METRICS, power_fit: str = PLAIN
) -> SeedSamples:
    """The calibration split's samples of `runs` by seed (held-out seeds never read; the power law fitted by
    `power_fit`)."""
    train, _held_out = owncorpus.split(
        [c for m in metrics for c in owncorpus.cases(runs, m, us=owncorpus.CALIBRATION_U, smooths=(False, True))]
    )
    # The pad on targets spread as the evaluation's are (u uniform in [0.4, 1]), so it is sized for what it serves.
    pad_cases = [
        c
        for m in pad_metrics
        for c in owncorpus.cases(runs, m, us=owncorpus.PAD_U, smooths=(False, True))
        if c.seed not in owncorpus.HELD_OUT_SEEDS
    ]
    return SeedSamples(
        {
            s: _rows(owncorpus.samples([c for c in train if c.seed == s], power_fit=power_fit))
            for s in sorted({c.seed for c in train})
        },
        {
            s: _rows(
                owncorpus.samples([c for c in pad_cases if c.seed == s], cuts=owncorpus.PAD_CUTS, power_fit=power_fit)
            )
            for s in sorted({c.seed for c in pad_cases})
        },
        len(pad_cases),
    )


def _rows(got: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return got[0].reshape(-1, len(FEATURES)), got[1]


def merged(parts: Sequence[SeedSamples]) -> SeedSamples:
    """The samples of several parts (families), seed by seed, in the parts' order."""

    def join(by: list[dict[int, tuple[np.ndarray, np.ndarray]]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        seeds = sorted({s for part in by for s in part})
        return {
            s: (
                np.concatenate([p[s][0] for p in by if s in p]).reshape(-1, len(FEATURES)),
                np.concatenate([p[s][1] for p in by if s in p]),
            )
            for s in seeds
        }

    return SeedSamples(join([p.fit for p in parts]), join([p.pad for p in parts]), sum(p.pad_cases for p in parts))


def calibration_from(
    samples: SeedSamples,
    *,
    runs: list[dict],
    metrics: Sequence[str],
    pad_metrics: Sequence[str] = PAD_METRICS,
    jobs: int = 1,
    power_fit: str = PLAIN,
) -> dict:
    """Cross-fitted by seed: one network per seed of the calibration split, fitted on the others; each scores the
    seed it never saw, and the pads come from all those out-of-fold scores (every run serves both the fit and
    the pad); the networks together are the ensemble the live estimate averages. `runs`: what the samples are
    of (recorded in the file); the networks fitted in up to `jobs` processes; `power_fit`: how the samples'
    power law was fitted (recorded in the file, unless PLAIN, so that the live estimate reads it alike)."""
    seeds = sorted(samples.fit)

    def fitted(seed: int) -> dict:
        x = np.concatenate([samples.fit[s][0] for s in seeds if s != seed])
        y = np.concatenate([samples.fit[s][1] for s in seeds if s != seed])
        return fit_net(x, y, seed=seed)

    nets = in_processes(fitted, seeds, jobs=jobs)
    scored, truths = [], []
    for seed, net in zip(seeds, nets):
        px, py = samples.pad.get(seed, (np.zeros((0, len(FEATURES))), np.zeros(0)))
        scored.append(quantile_rows(px, net))
        truths.append(py)
    return ({"power_fit": power_fit} if power_fit != PLAIN else {}) | {
        "version": 2,
        "features": list(FEATURES),
        "metrics": list(metrics),
        "runs": len(runs),
        "groups": sorted({r["group"] for r in runs}),
        "fit_seeds": seeds,
        "fit_samples": int(sum(len(v[1]) for v in samples.fit.values())),
        "pad_cases": samples.pad_cases,
        "pad_samples": int(sum(len(t) for t in truths)),
        "held_out_seeds": list(owncorpus.HELD_OUT_SEEDS),
        "pad_metrics": list(pad_metrics),
        "pad_on": "seen",
        "pad_edges": list(SEEN_EDGES),
        "pads": conformal_pads(np.concatenate(scored), np.concatenate(truths)),
        "nets": nets,
    }


def quantile_rows(x: np.ndarray, net: dict) -> np.ndarray:
    """`owncurve.quantile_net` of every row of `x` at once: (n, 3) quantiles."""
    h = (np.asarray(x, float).reshape(-1, len(net["mean"])) - np.asarray(net["mean"])) / np.asarray(net["std"])
    for i, (w, b) in enumerate(net["layers"]):
        h = h @ np.asarray(w).T + np.asarray(b)
        if i < len(net["layers"]) - 1:
            h = np.maximum(h, 0.0)
    mid = h[:, 0]
    return np.stack([mid - np.logaddexp(0.0, h[:, 1]), mid, mid + np.logaddexp(0.0, h[:, 2])], axis=1)


def calibrate(runs: list[dict], metrics: list[str], *, pad_metrics: Sequence[str] = PAD_METRICS) -> dict:
    """`calibration_from` the samples of `runs`, gathered family by family (`owncorpus.family`, sorted) as the
    leave-one-family-out folds gather theirs (`ownnested`), so either path fits the same file."""
    families = sorted({owncorpus.family(r) for r in runs})
    parts = [
        seed_samples([r for r in runs if owncorpus.family(r) == f], metrics, pad_metrics=pad_metrics) for f in families
    ]
    return calibration_from(merged(parts), runs=runs, metrics=metrics, pad_metrics=pad_metrics)
