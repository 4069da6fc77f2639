"""Training of the own-job ETA's quantile network on the recorded sweep (offline; torch).

Only the calibration split is used (seeds not in `owncorpus.HELD_OUT_SEEDS`): the network is fitted on the seeds
outside `CONFORMAL_SEEDS`, and the conformal pad that makes its 10-90% band cover 80% is measured on those.
"""
import numpy as np
import torch
from torch import nn

from services.estimator.model import owncorpus
from services.estimator.model.owncurve import FEATURES, PAD_EDGES, quantile_net

QUANTILES = (0.1, 0.5, 0.9)
HIDDEN = 24
STEPS = 1500
MIN_PAD_SAMPLES = 100


def fit_net(x: np.ndarray, y: np.ndarray, *, seed: int = 0, hidden: int = HIDDEN, steps: int = STEPS,
            weight_decay: float = 1e-4) -> dict:
    """A 2-layer MLP giving (median, log-gap down, log-gap up), trained with the pinball loss; as JSON lists."""
    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)
    net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                        nn.Linear(hidden, 3))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for _ in range(steps):
        out = net(xt)
        mid = out[:, 0]
        qs = (mid - nn.functional.softplus(out[:, 1]), mid, mid + nn.functional.softplus(out[:, 2]))
        loss = sum(torch.mean(torch.maximum(q * (yt - pred), (q - 1) * (yt - pred)))
                   for q, pred in zip(QUANTILES, qs))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    layers = [m for m in net if isinstance(m, nn.Linear)]
    return {"mean": mean.round(6).tolist(), "std": std.round(6).tolist(),
            "layers": [[np.round(m.weight.detach().numpy(), 5).tolist(), np.round(m.bias.detach().numpy(), 5).tolist()]
                       for m in layers]}


def conformal_pad(net: dict, x: np.ndarray, y: np.ndarray, *, coverage: float = 0.8) -> float:
    """How much to widen (or narrow) the band, in log units, for it to cover `coverage` of held-out samples
    (conformalised quantile regression)."""
    scores = []
    for features, truth in zip(x, y):
        low, _, high = quantile_net(features, net)
        scores.append(max(low - truth, truth - high))
    level = min(1.0, coverage * (1 + 1 / len(scores)))
    return float(np.quantile(scores, level))


def conformal_pads(net: dict, x: np.ndarray, y: np.ndarray, *, coverage: float = 0.8) -> list[float]:
    """The pad per bin of the way covered (`PAD_EDGES`): the network is less sure in some phases of a curve
    (its steep middle) than in others, and one pad for all would over-cover some and under-cover the rest."""
    way = x[:, FEATURES.index("way")]
    bins = np.searchsorted(PAD_EDGES, way, side="right")
    overall = conformal_pad(net, x, y, coverage=coverage)
    return [round(conformal_pad(net, x[bins == b], y[bins == b], coverage=coverage), 4)
            if np.sum(bins == b) >= MIN_PAD_SAMPLES else round(overall, 4) for b in range(len(PAD_EDGES) + 1)]


def calibrate(runs: list[dict], metrics: list[str]) -> dict:
    cases = [c for m in metrics
             for c in owncorpus.cases(runs, m, us=owncorpus.CALIBRATION_U, smooths=(False, True))]
    train, _held_out = owncorpus.split(cases)
    fit_cases = [c for c in train if c.seed not in owncorpus.CONFORMAL_SEEDS]
    pad_cases = [c for c in train if c.seed in owncorpus.CONFORMAL_SEEDS]
    x, y = owncorpus.samples(fit_cases)
    net = fit_net(x, y)
    px, py = owncorpus.samples(pad_cases)
    pad = conformal_pad(net, px, py)
    pads = conformal_pads(net, px, py)
    return {"version": 1, "features": list(FEATURES), "metrics": metrics, "runs": len(runs),
            "fit_cases": len(fit_cases), "fit_samples": len(y), "pad_cases": len(pad_cases),
            "pad_samples": len(py), "held_out_seeds": list(owncorpus.HELD_OUT_SEEDS), "pad": round(pad, 4),
            "pad_edges": list(PAD_EDGES), "pads": pads, "net": net}
