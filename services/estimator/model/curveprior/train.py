"""Training of the curve prior (offline; torch, one thread): pre-training on synthetic curves, fine-tuning on
recorded own-job runs, and the conformal pads.

    nice -n 10 .venv/bin/python -m services.estimator.model.curveprior.train pretrain --seed 0 --until 18:20
    nice -n 10 .venv/bin/python -m services.estimator.model.curveprior.train finetune   # writes prior.npz

`pretrain` draws `--curves` synthetic curves from `sampler` (seeded), encodes every cut and trains the network
with the cross-entropy of the truth's bin (the PFN's Riemann loss) until its epochs or `--until` (UTC, HH:MM)
come; `finetune` starts from `pretrained.npz` and trains on the recorded runs of the given seeds (by default
0-2; seed 3 sizes the pads, seed 4 is the evaluation's), mixed with as many synthetic samples.
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.estimator.model import owncorpus
from services.estimator.model.curveprior import sampler
from services.estimator.model.curveprior.encode import BINS, N_INPUTS, encode, truth_bin
from services.estimator.model.curveprior.net import PRETRAINED, WEIGHTS, PriorNet, load, quantiles
from services.estimator.model.owncurve import SEEN_EDGES
from services.estimator.model.owntrain import conformal_pads

HIDDEN = 192
FIT_SEEDS = (0, 1, 2)
PAD_SEEDS = (3,)
METRICS = ("loss", "val_loss", "val_acc")
MIX = 0.5  # the synthetic prior's share of the served distribution (set a priori, not tuned on any held-out run)


def synthetic(curves: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, truth bins) of every cut of `curves` synthetic curves."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(curves):
        for s in sampler.sample(rng):
            e = encode(s.ts, s.xs, s.values, target=s.target, mode=s.mode, elapsed=s.elapsed)
            if e is not None:
                xs.append(e.x)
                ys.append(truth_bin((s.truth - e.origin) / e.span) if math.isfinite(s.truth) else BINS)
    return np.asarray(xs, np.float32), np.asarray(ys, np.int64)


def recorded(
    cases: list[owncorpus.Case], cuts: Iterable[float] = owncorpus.CALIBRATION_CUTS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, truth bins, truth log ratios) of the recorded cases at every cut."""
    xs, ys, rs = [], [], []
    for case in cases:
        for cut in cuts:
            elapsed = cut * case.truth
            ts, steps, values = owncorpus.prefix(case, elapsed)
            e = encode(ts, steps, values, target=case.target, mode=case.mode, elapsed=elapsed)
            if e is not None and case.truth > e.origin:
                xs.append(e.x)
                ys.append(truth_bin((case.truth - e.origin) / e.span))
                rs.append(math.log((case.truth - e.origin) / e.span))
    return np.asarray(xs, np.float32).reshape(-1, N_INPUTS), np.asarray(ys, np.int64), np.asarray(rs)


def training_cases(runs: list[dict], seeds: Collection[int]) -> list[owncorpus.Case]:
    return [
        c
        for m in METRICS
        for c in owncorpus.cases(runs, m, us=owncorpus.CALIBRATION_U, smooths=(False, True))
        if c.seed in seeds
    ]


def _module(hidden: int = HIDDEN) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(N_INPUTS, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, BINS + 1),
    )


def _to_prior(module: nn.Sequential, mean: np.ndarray, std: np.ndarray) -> PriorNet:
    layers = tuple(
        (m.weight.detach().numpy().astype(np.float64), m.bias.detach().numpy().astype(np.float64))
        for m in module
        if isinstance(m, nn.Linear)
    )
    return PriorNet(layers, mean.astype(np.float64), std.astype(np.float64))


def _from_prior(net: PriorNet) -> nn.Sequential:
    module = _module(net.layers[0][0].shape[0])
    for m, (w, b) in zip([m for m in module if isinstance(m, nn.Linear)], net.layers):
        m.weight.data = torch.tensor(w, dtype=torch.float32)
        m.bias.data = torch.tensor(b, dtype=torch.float32)
    return module


def fit(
    module: nn.Sequential,
    x: np.ndarray,
    y: np.ndarray,
    *,
    mean: np.ndarray,
    std: np.ndarray,
    epochs: int,
    lr: float,
    seed: int,
    deadline: float = math.inf,
    batch: int = 1024,
) -> nn.Sequential:
    """Cross-entropy of the truth's bin, Adam with a cosine schedule, until `epochs` or the deadline."""
    torch.manual_seed(seed)
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y)
    opt = torch.optim.Adam(module.parameters(), lr=lr, weight_decay=1e-5)
    steps = epochs * math.ceil(len(y) / batch)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        total = 0.0
        for start in range(0, len(y), batch):
            idx = order[start : start + batch]
            loss = nn.functional.cross_entropy(module(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            schedule.step()
            total += loss.item() * len(idx)
        print(f"epoch {epoch}: loss {total / len(y):.4f}", flush=True)
        if time.time() > deadline:
            break
    return module


def pretrain(*, curves: int, seed: int, epochs: int, deadline: float) -> PriorNet:
    x, y = synthetic(curves, seed=seed)
    print(f"{len(y)} synthetic samples of {curves} curves", flush=True)
    mean, std = x.mean(0), x.std(0) + 1e-3
    torch.manual_seed(seed)  # the initial weights too: unseeded, two builds of the same curves differed
    module = fit(_module(), x, y, mean=mean, std=std, epochs=epochs, lr=2e-3, seed=seed, deadline=deadline)
    return _to_prior(module, mean, std)


def finetune(
    base: PriorNet, cases: list[owncorpus.Case], *, seed: int = 0, epochs: int = 6, synthetic_curves: int = 6000
) -> PriorNet:
    """The prior trained further on recorded cases, mixed with fresh synthetic ones so it keeps what it knew."""
    x, y, _ = recorded(cases)
    return finetune_samples(base, x, y, seed=seed, epochs=epochs, synthetic_curves=synthetic_curves)


@functools.lru_cache(maxsize=2)
def _synthetic_once(curves: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`synthetic`, drawn once a process: every fold of the nested split mixes in the same fresh curves."""
    return synthetic(curves, seed=seed)


def synthetic_mix(curves: int = 6000, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The fresh synthetic samples a fine-tuning with `seed` mixes in (drawn once a process)."""
    return _synthetic_once(curves, 10_000 + seed)


def finetune_samples(
    base: PriorNet, x: np.ndarray, y: np.ndarray, *, seed: int = 0, epochs: int = 6, synthetic_curves: int = 6000
) -> PriorNet:
    """`finetune` on recorded samples already encoded ((inputs, truth bins) of `recorded`)."""
    sx, sy = synthetic_mix(synthetic_curves, seed=seed)
    x, y = np.concatenate([x, sx]), np.concatenate([y, sy])
    module = fit(_from_prior(base), x, y, mean=base.mean, std=base.std, epochs=epochs, lr=3e-4, seed=seed)
    return _to_prior(module, base.mean, base.std)


def mixed(tuned: PriorNet, base: PriorNet, weight: float = MIX) -> PriorNet:
    """The fine-tuned network with the synthetic prior's distribution mixed in at `weight`."""
    return PriorNet(tuned.layers, tuned.mean, tuned.std, mixed=((base, weight),))


def pad_samples(cases: list[owncorpus.Case]) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, truth log ratios) the pads are sized on: every cut of `cases` every 5% of the run."""
    x, _, truths = recorded(cases, cuts=owncorpus.PAD_CUTS)
    return x, truths


def with_pads(net: PriorNet, samples: tuple[np.ndarray, np.ndarray]) -> PriorNet:
    """The network with conformal pads (per phase of the run) that make its 10-90% band cover 80% of the
    `pad_samples` (training loss, targets and cuts spread as the evaluation's)."""
    x, truths = samples
    q = np.array([quantiles(p, (0.1, 0.5, 0.9)) for p in net.probabilities(x)])
    return PriorNet(
        net.layers,
        net.mean,
        net.std,
        tuple(SEEN_EDGES),
        tuple((float(down), float(up)) for down, up in conformal_pads(q, truths)),
        net.mixed,
    )


def pad_cases(runs: list[dict], seeds: Collection[int]) -> list[owncorpus.Case]:
    return [c for c in owncorpus.cases(runs, "loss", us=owncorpus.PAD_U, smooths=(False, True)) if c.seed in seeds]


def _deadline(until: str | None) -> float:
    if not until:
        return math.inf
    now = datetime.now(UTC)
    hour, minute = (int(v) for v in until.split(":"))
    end = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return end.timestamp()


def _tune(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """The finetune stage (fine-tuning, the mixture, the pads), or the pads alone on the shipped network."""
    base = load(PRETRAINED)
    if base is None:
        ap.error(f"cannot read the pre-trained prior {PRETRAINED}: run the pretrain stage first")
    runs = owncorpus.load_corpus(owncorpus.TRAINED)  # never the held-out families
    if args.stage == "pads":  # the pads again, on the shipped network's own layers (its mixture as set by MIX)
        shipped = load(WEIGHTS)
        if shipped is None:
            ap.error(f"cannot read {WEIGHTS}: run the finetune stage first")
        tuned = PriorNet(shipped.layers, shipped.mean, shipped.std)
    else:
        tuned = finetune(base, training_cases(runs, FIT_SEEDS), seed=args.seed, epochs=args.epochs)
    net = with_pads(mixed(tuned, base), pad_samples(pad_cases(runs, PAD_SEEDS)))
    net.save(args.out or WEIGHTS, fit_seeds=list(FIT_SEEDS), pad_seeds=list(PAD_SEEDS))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stage", choices=("pretrain", "finetune", "pads"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--curves", type=int, default=80_000)
    ap.add_argument("--epochs", type=int, default=40, help="40 pre-training, 6 fine-tuning (make eta-prior)")
    ap.add_argument("--until", help="UTC HH:MM: stop training after the epoch that passes it")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.monotonic()
    if args.stage == "pretrain":
        net = pretrain(curves=args.curves, seed=args.seed, epochs=args.epochs, deadline=_deadline(args.until))
        net.save(args.out or PRETRAINED, curves=args.curves, seed=args.seed)
    else:
        _tune(args, ap)
    print(f"{args.out or (PRETRAINED if args.stage == 'pretrain' else WEIGHTS)}: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
