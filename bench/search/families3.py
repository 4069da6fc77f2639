"""A third never-seen split (issue 31, the plain jobs its table names): two kinds of small PyTorch training as a new
user writes them, recorded before anything in the serving path was changed and never tuned on (the check).

- `sgd-regression`: an MLP regression of a smooth function, full-batch SGD, the full-batch loss printed every 10
  steps (`step N loss X`), as the issue's first job.
- `adam-ema`: an MLP with Adam on fresh mini-batches of a fixed random teacher, an exponential moving average of
  the batch loss printed (started at the first loss, or from zero with or without Adam's bias correction), as
  the second.

Each step sleeps `pause` seconds (a heavier model's step, at little CPU). `startup_s` is the wall time a fresh
`python -c "import torch"` took when the recorder began: a job's clock starts at its process's start, before its
first line. One line per run in `data/families3.jsonl.gz`, broad's shape (`points`: t, step, loss).

    nice -n 10 .venv/bin/python -m bench.search.families3 --runs 16 --until 14:10
"""

import random
import time
import zlib
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from bench.search.families import log_uniform
from bench.search.families_models import mlp
from bench.search.record import _finite, record_family_runs

DATA = Path(__file__).parent / "data" / "families3.jsonl.gz"
FAMILIES = ("sgd-regression", "adam-ema")
# The targets a user declares, chosen before recording (a run that never reaches one has no case for it).
TARGETS = {"sgd-regression": (0.05, 0.03, 0.02), "adam-ema": (0.02, 0.01, 0.005, 0.002)}


def run_params(index: int) -> tuple[str, dict]:
    """The family and parameters of run `index` (deterministic; the families take turns)."""
    rng = random.Random(zlib.crc32(f"families3-{index}".encode()))
    family = FAMILIES[index % len(FAMILIES)]
    common = {"seed": rng.randrange(5), "features": rng.choice((4, 8, 16)), "pause": rng.choice((0.008, 0.012))}
    if family == "sgd-regression":
        return family, common | {
            "opt": "sgd",
            "lr": log_uniform(rng, 0.03, 0.15),
            "momentum": rng.choice((0.0, 0.9)),  # the step is lr / 10 with momentum (its effective rate x10)
            "width": rng.choice((16, 32, 64)),
            "samples": rng.choice((512, 1024)),
            "noise": rng.choice((0.02, 0.05)),
            "steps": rng.choice((2000, 3000)),
            "every": 10,
        }
    return family, common | {
        "opt": "adam",
        "lr": log_uniform(rng, 5e-4, 3e-3),
        "width": rng.choice((32, 64, 128)),
        "batch": rng.choice((32, 64)),
        "steps": rng.choice((1500, 2500)),
        "every": rng.choice((10, 25)),
        "beta": rng.choice((0.9, 0.98, 0.99)),
        "init": rng.choice(("first", "debiased", "zero")),
    }


def _teacher(features: int, seed: int) -> nn.Module:
    """A fixed random tanh network on inputs scaled x2.5 (a function with some detail, learnt slowly at the end)."""
    torch.manual_seed(1000 + features + seed)
    net = mlp(features, 32, 1, depth=2, act="tanh")
    for p in net.parameters():
        p.requires_grad_(False)
    return nn.Sequential(Scale(2.5), net)


class Scale(nn.Module):
    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.factor * x


def train(family: str, params: dict) -> dict:
    """The run's printed points and its wall time (from the loop's start)."""
    teacher = _teacher(params["features"], params["seed"])
    gen = torch.Generator().manual_seed(params["seed"])
    scale = float(teacher(torch.randn(4096, params["features"], generator=gen)).std())
    torch.manual_seed(params["seed"])
    if family == "sgd-regression":
        x = torch.randn(params["samples"], params["features"], generator=gen)
        y = teacher(x) / scale + params["noise"] * torch.randn(params["samples"], 1, generator=gen)
        model = mlp(params["features"], params["width"], 1, depth=2, act="tanh")
        lr = params["lr"] * (0.1 if params["momentum"] else 1.0)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=params["momentum"])
    else:
        model = mlp(params["features"], params["width"], 1, depth=2, act="relu")
        opt = torch.optim.Adam(model.parameters(), lr=params["lr"])
    ema, points, start = 0.0, [], time.monotonic()
    for step in range(1, params["steps"] + 1):
        if family == "adam-ema":
            x = torch.randn(params["batch"], params["features"], generator=gen)
            y = teacher(x) / scale
        opt.zero_grad()
        loss = functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        value = loss.item()
        if family == "adam-ema":
            beta = params["beta"]
            ema = value if step == 1 and params["init"] == "first" else beta * ema + (1 - beta) * value
            value = ema / (1 - beta**step) if params["init"] == "debiased" else ema
        time.sleep(params["pause"])
        if step % params["every"] == 0:
            points.append({"t": round(time.monotonic() - start, 4), "step": step, "loss": _finite(value)})
    return {"points": points, "wall_s": round(time.monotonic() - start, 4)}


def main(argv: list[str] | None = None) -> None:
    record_family_runs(
        argv,
        description=__doc__.splitlines()[0],
        default_runs=16,
        default_out=DATA,
        prefix="families3",
        run_params=run_params,
        train=train,
    )


if __name__ == "__main__":
    main()
