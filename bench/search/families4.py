"""Three more families for the own-jobs corpus (issue 31 item 5): trainings whose loss falls over decades and is
still falling when the recording stops, unlike the eleven trained families, which mostly flatten onto a floor well
above their targets. Designed and recorded before any build read them; the never-seen splits (`families2`,
`families3`) and issue 31's plain jobs are not like any of them by construction (different models, data and
optimisers), and were not looked at to choose them.

- `logreg-separable`: a linear classifier on linearly separable data (a margin kept), full-batch gradient descent
  (plain or heavy-ball), the binary cross-entropy printed every 10 steps: once the data are separated the loss
  falls as a slow power law toward 0 and never flattens.
- `lstsq-spectrum`: linear least squares whose features have a power-law spectrum (eigenvalue i ∝ i^-a), full-batch
  gradient descent: the large directions collapse at once, the small ones take decades of steps (the loss a power
  law in time) down to the noise's floor.
- `conv-adamw-cosine`: a small convolutional net learning a fixed random convolutional teacher on fresh batches,
  AdamW under a cosine (or warm-up and cosine) schedule, an exponential moving average of the batch loss printed:
  the schedule's annealing makes the loss fall faster late in the run.

Each step sleeps `pause` seconds (a heavier model's step, at little CPU); values are printed to six significant
digits (`record._finite`: a loss of 1e-5 is not 0). `startup_s` as in `families3` (`record.torch_startup_s`). One
line per run in `data/families4.jsonl.gz`.

    nice -n 10 .venv/bin/python -m bench.search.families4 --runs 72 --until 12:30
"""

import random
import time
import zlib
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from bench.search.families import log_uniform
from bench.search.families_models import conv_net, multiplier
from bench.search.record import _finite, record_family_runs

DATA = Path(__file__).parent / "data" / "families4.jsonl.gz"
FAMILIES = ("logreg-separable", "lstsq-spectrum", "conv-adamw-cosine")


def run_params(index: int) -> tuple[str, dict]:
    """The family and parameters of run `index` (deterministic; the families take turns)."""
    rng = random.Random(zlib.crc32(f"families4-{index}".encode()))
    family = FAMILIES[index % len(FAMILIES)]
    common = {"seed": rng.randrange(5), "pause": rng.choice((0.003, 0.006))}
    if family == "logreg-separable":
        return family, common | {
            "features": rng.choice((8, 16, 32)),
            "samples": rng.choice((256, 512, 1024)),
            "margin": rng.choice((0.02, 0.05, 0.1)),
            "lr": log_uniform(rng, 0.2, 2.0),
            "momentum": rng.choice((0.0, 0.9)),
            "steps": rng.choice((1500, 2500)),
            "every": 10,
        }
    if family == "lstsq-spectrum":
        return family, common | {
            "features": rng.choice((64, 128)),
            "samples": rng.choice((512, 1024)),
            "decay": rng.choice((1.0, 1.5, 2.0)),
            "noise": rng.choice((0.003, 0.01, 0.03)),
            "lr": round(rng.uniform(0.3, 0.9), 3),  # times 1 / the largest eigenvalue (the step is stable below 1)
            "steps": rng.choice((1500, 2500)),
            "every": rng.choice((10, 20)),
        }
    return family, common | {
        "channels": rng.choice((4, 8)),
        "lr": log_uniform(rng, 3e-3, 1e-2),
        "schedule": rng.choice(("cosine", "warmup-cosine")),
        "batch": rng.choice((32, 64)),
        "beta": rng.choice((0.9, 0.98)),
        "steps": rng.choice((1200, 2000)),
        "every": rng.choice((10, 20)),
    }


def _logreg(params: dict, gen: torch.Generator):
    d, n = params["features"], params["samples"]
    w = torch.randn(d, generator=gen)
    w = w / w.norm()
    x = torch.randn(4 * n, d, generator=gen)
    x = x[(x @ w).abs() > params["margin"]][:n]
    y = (x @ w > 0).float()
    model = nn.Linear(d, 1)
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=params["momentum"])
    return model, opt, lambda: functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)


def _lstsq(params: dict, gen: torch.Generator):
    d, n = params["features"], params["samples"]
    scales = torch.arange(1, d + 1, dtype=torch.float32) ** (-params["decay"] / 2)
    x = torch.randn(n, d, generator=gen) * scales
    w = torch.randn(d, 1, generator=gen)
    y = x @ w + params["noise"] * torch.randn(n, 1, generator=gen)
    top = float(torch.linalg.eigvalsh(x.T @ x / n).max())
    model = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=params["lr"] / top)
    return model, opt, lambda: functional.mse_loss(model(x), y)


def train(family: str, params: dict) -> dict:
    """The run's printed points and its wall time (from the loop's start)."""
    gen = torch.Generator().manual_seed(params["seed"])
    torch.manual_seed(params["seed"])
    steps = params["steps"]
    if family == "conv-adamw-cosine":
        teacher = conv_net(channels=4, depth=2, size=12, classes=1, norm=False)
        for p in teacher.parameters():
            p.requires_grad_(False)
        model = conv_net(channels=params["channels"], depth=2, size=12, classes=1, norm=False)
        opt = torch.optim.AdamW(model.parameters(), lr=params["lr"], weight_decay=0.01)
        factor = multiplier(params["schedule"], steps, warmup=steps // 20)
        scale = float(teacher(torch.randn(1024, 1, 12, 12, generator=gen)).std())

        def loss_of():
            x = torch.randn(params["batch"], 1, 12, 12, generator=gen)
            return functional.mse_loss(model(x), teacher(x) / scale)

    else:
        model, opt, loss_of = (_logreg if family == "logreg-separable" else _lstsq)(params, gen)
        factor = None
    ema, points, start = 0.0, [], time.monotonic()
    for step in range(1, steps + 1):
        if factor is not None:
            for group in opt.param_groups:
                group["lr"] = params["lr"] * factor(step - 1)
        opt.zero_grad()
        loss = loss_of()
        loss.backward()
        opt.step()
        value = loss.item()
        if family == "conv-adamw-cosine":
            ema = value if step == 1 else params["beta"] * ema + (1 - params["beta"]) * value
            value = ema
        time.sleep(params["pause"])
        if step % params["every"] == 0:
            points.append({"t": round(time.monotonic() - start, 4), "step": step, "loss": _finite(value)})
    return {"points": points, "wall_s": round(time.monotonic() - start, 4)}


def main(argv: list[str] | None = None) -> None:
    record_family_runs(
        argv,
        description=__doc__.splitlines()[0],
        default_runs=72,
        default_out=DATA,
        prefix="families4",
        run_params=run_params,
        train=train,
    )


if __name__ == "__main__":
    main()
