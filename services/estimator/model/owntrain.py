"""Training of the own-job ETA's quantile networks on the recorded corpus (offline; torch).

Only the calibration split is used (seeds not in `owncorpus.HELD_OUT_SEEDS`), cross-fitted by seed: each network
is fitted on all seeds but one and scored on that one; the conformal pads that make the ensemble's 10-90% band
cover 80% come from those out-of-fold scores.
"""

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from services.estimator.model import owncorpus
from services.estimator.model.owncurve import FEATURES, SEEN_EDGES, quantile_net

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


def calibrate(runs: list[dict], metrics: list[str], *, pad_metrics: Sequence[str] = PAD_METRICS) -> dict:
    """Cross-fitted by seed: one network per seed of the calibration split, fitted on the others; each scores the
    seed it never saw, and the pads come from all those out-of-fold scores (every run serves both the fit and
    the pad); the networks together are the ensemble the live estimate averages."""
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
    seeds = sorted({c.seed for c in train})
    by_seed = {s: owncorpus.samples([c for c in train if c.seed == s]) for s in seeds}
    nets, scored, truths = [], [], []
    for seed in seeds:
        x = np.concatenate([by_seed[s][0] for s in seeds if s != seed])
        y = np.concatenate([by_seed[s][1] for s in seeds if s != seed])
        nets.append(fit_net(x, y, seed=seed))
        px, py = owncorpus.samples([c for c in pad_cases if c.seed == seed], cuts=owncorpus.PAD_CUTS)
        scored += [quantile_net(f, nets[-1]) for f in px]
        truths.append(py)
    return {
        "version": 2,
        "features": list(FEATURES),
        "metrics": metrics,
        "runs": len(runs),
        "groups": sorted({r["group"] for r in runs}),
        "fit_seeds": seeds,
        "fit_samples": int(sum(len(v[1]) for v in by_seed.values())),
        "pad_cases": len(pad_cases),
        "pad_samples": len(scored),
        "held_out_seeds": list(owncorpus.HELD_OUT_SEEDS),
        "pad_metrics": list(pad_metrics),
        "pad_on": "seen",
        "pad_edges": list(SEEN_EDGES),
        "pads": conformal_pads(np.asarray(scored), np.concatenate(truths)),
        "nets": nets,
    }
