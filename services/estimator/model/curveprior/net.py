"""The served curve prior: the network's forward pass on numpy (the estimator never imports torch), its Riemann
output read as quantiles of log(training time to the target / training time so far), and the conformal pads."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.estimator.model.curveprior.encode import BINS, EDGES, N_INPUTS

WEIGHTS = Path(__file__).with_name("prior.npz")  # fine-tuned on the recorded runs' seeds 0-2, pads from seed 3
PRETRAINED = Path(__file__).with_name("pretrained.npz")  # synthetic curves only
FORMAT_VERSION = 1
LOG_HORIZON = float(EDGES[-1])


@dataclass(frozen=True)
class PriorNet:
    """Weights (W, b per layer, ReLU between), input scaling, the conformal pads per phase of the run, and other
    networks whose distributions are mixed in (network, weight): the fine-tuned network mixed with the synthetic
    prior it started from keeps the prior's doubt where the two disagree, on a curve unlike the recorded ones."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    mean: np.ndarray
    std: np.ndarray
    pad_edges: tuple[float, ...] = ()
    pads: tuple[tuple[float, float], ...] = ()
    mixed: tuple[tuple[PriorNet, float], ...] = ()

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """P(bin) over the BINS bins of r and the last "beyond the horizon" bin, for one input or a batch."""
        own = 1.0 - sum(w for _, w in self.mixed)
        return own * self._own(x) + sum(w * net.probabilities(x) for net, w in self.mixed)

    def _own(self, x: np.ndarray) -> np.ndarray:
        h = (np.asarray(x, np.float64) - self.mean) / self.std
        for i, (w, b) in enumerate(self.layers):
            h = h @ w.T + b
            if i < len(self.layers) - 1:
                h = np.maximum(h, 0.0)
        h = h - h.max(axis=-1, keepdims=True)
        e = np.exp(h)
        return e / e.sum(axis=-1, keepdims=True)

    def band(self, x: np.ndarray) -> tuple[float, float, float, float]:
        """(10%, 50%, 90% of r, P(beyond the horizon)) with the conformal pads of the run's phase (the fraction
        seen the median says); a quantile beyond the horizon is the horizon."""
        p = self.probabilities(x)
        q10, q50, q90 = quantiles(p, (0.1, 0.5, 0.9))
        low, high = pads_for(self.pad_edges, self.pads, q50)
        return max(q10 - low, 0.0), q50, min(q90 + high, LOG_HORIZON), float(p[-1])

    def save(self, path: Path, **meta: object) -> None:
        arrays: dict[str, np.ndarray] = {f"w{i}": w.astype(np.float32) for i, (w, _) in enumerate(self.layers)}
        arrays |= {f"b{i}": b.astype(np.float32) for i, (_, b) in enumerate(self.layers)}
        arrays |= {
            "version": np.asarray(FORMAT_VERSION),
            "mean": self.mean.astype(np.float32),
            "std": self.std.astype(np.float32),
            "pad_edges": np.asarray(self.pad_edges, float),
            "pads": np.asarray(self.pads, float).reshape(-1, 2),
            "mix_pretrained": np.asarray(sum(w for _, w in self.mixed)),
        }
        arrays |= {f"meta_{k}": np.asarray(v) for k, v in meta.items()}
        np.savez_compressed(path, **arrays)  # type: ignore[arg-type]  # numpy's stub types the first keyword


def pads_for(edges: Sequence[float], pads: Sequence[Sequence[float]], q50: float) -> tuple[float, float]:
    """The (down, up) pads of the bin of the fraction of the training the median says is seen."""
    if not pads or len(pads) != len(edges) + 1:
        return 0.0, 0.0
    down, up = pads[bisect.bisect_right(list(edges), math.exp(-q50))]
    return float(down), float(up)


def quantiles(p: np.ndarray, levels: Iterable[float]) -> list[float]:
    """Quantiles of r under the Riemann distribution `p` (uniform within each bin, the last bin beyond the
    horizon); a level past the finite mass is the horizon."""
    cdf = np.cumsum(p[:BINS])
    out = []
    for level in levels:
        k = int(np.searchsorted(cdf, level))
        if k >= BINS:
            out.append(LOG_HORIZON)
            continue
        before = cdf[k - 1] if k else 0.0
        share = (level - before) / max(float(p[k]), 1e-12)
        out.append(float(EDGES[k] + min(max(share, 0.0), 1.0) * (EDGES[k + 1] - EDGES[k])))
    return out


def load(path: Path = WEIGHTS) -> PriorNet | None:
    """The shipped prior; None when it is missing, unreadable or of another format (the old estimate applies)."""
    try:
        with np.load(path) as f:
            if int(f["version"]) != FORMAT_VERSION:
                return None
            n = sum(1 for k in f.files if k.startswith("w"))
            layers = tuple((f[f"w{i}"].astype(np.float64), f[f"b{i}"].astype(np.float64)) for i in range(n))
            mean, std = f["mean"].astype(np.float64), f["std"].astype(np.float64)
            edges = tuple(float(v) for v in f["pad_edges"])
            pads = tuple((float(a), float(b)) for a, b in f["pads"])
            mix = float(f["mix_pretrained"]) if "mix_pretrained" in f.files else 0.0
    except (OSError, ValueError, KeyError):
        return None
    if not layers or layers[0][0].shape[1] != N_INPUTS or layers[-1][0].shape[0] != BINS + 1:
        return None
    mixed: tuple[tuple[PriorNet, float], ...] = ()
    if mix > 0:  # the synthetic prior this network was fine-tuned from, beside it
        base = load(path.with_name(PRETRAINED.name))
        if base is None or base.mixed:
            return None
        mixed = ((base, mix),)
    return PriorNet(layers, mean, std, edges, pads, mixed)
