"""A second never-seen split (issue 31, item 5): five families of small real trainings unlike the eleven of the digits
sweep, `broad.py` and `families.py`, recorded before anything was tuned on the eleven and scored once, at the end,
as the untouched figure (`--split unseen`). One line per run in `data/families2.jsonl.gz`, `families.py`'s shape:
`params` has `steps`, `printed`, `schedule`, and `ppl` where the printed losses are perplexities.

    nice -n 15 .venv/bin/python -m bench.search.families2 --runs 100 --until 05:55
"""

import math
import random
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from bench.search import families_data as data
from bench.search.families import log_uniform, sampler
from bench.search.families_fit import Task, classify, every, recorder
from bench.search.families_models import mlp
from bench.search.record import _finite, record_runs

DATA = Path(__file__).parent / "data" / "families2.jsonl.gz"
FAMILIES = ("autoencoder", "ppl-convlm", "noisy-logreg", "distill", "resnet-epochs")
LR = {"sgd": (5e-3, 0.2), "adam": (3e-4, 1e-2), "adamw": (3e-4, 1e-2)}
TEXT_SEED = 777


def run_params(index: int) -> tuple[str, dict]:
    """The family and parameters of run `index` (deterministic; the families take turns)."""
    rng = random.Random(zlib.crc32(f"families2-{index}".encode()))
    family = FAMILIES[index % len(FAMILIES)]
    opt = rng.choice(("sgd", "adam", "adamw"))
    params = {"opt": opt, "lr": log_uniform(rng, *LR[opt]), "seed": rng.randrange(5), "printed": "avg"}
    return family, params | FAMILY_PARAMS[family](rng, params)


def _autoencoder_params(rng, params):
    return {
        "data": rng.choice(("digits", "shapes")),
        "bottleneck": rng.choice((4, 8, 16)),
        "width": rng.choice((32, 64, 128)),
        "noise": rng.choice((0.0, 0.0, 0.2, 0.4)),  # a denoising autoencoder's input noise
        "batch": rng.choice((16, 32, 64)),
        "steps": rng.choice((1500, 2500, 4000)),
        "schedule": rng.choice(("constant", "cosine")),
        "points": rng.choice((50, 80)),
    }


def _convlm_params(rng, params):
    steps = rng.choice((300, 500, 800))
    return {
        "opt": "adamw",
        "lr": log_uniform(rng, 1e-3, 8e-3),
        "wd": rng.choice((0.01, 0.1)),
        "data": "charlm",
        "length": 64,
        "dim": rng.choice((32, 48, 64)),
        "blocks": rng.choice((2, 3)),
        "batch": rng.choice((16, 32)),
        "steps": steps,
        "schedule": rng.choice(("warmup-cosine", "warmup-cosine", "warmup")),
        "warmup": steps // rng.choice((10, 20)),
        "points": rng.choice((40, 60)),
        "ppl": True,
    }


def _logreg_params(rng, params):
    return {
        "opt": rng.choice(("sgd", "sgd", "adam")),
        "lr": log_uniform(rng, 3e-3, 0.1),
        "data": "noisy-linear",
        "features": rng.choice((20, 50, 100)),
        "flip": rng.choice((0.1, 0.25, 0.4)),
        "batch": rng.choice((8, 16, 64)),
        "steps": rng.choice((2000, 4000, 6000)),
        "schedule": rng.choice(("constant", "constant", "step")),
        "printed": rng.choice(("avg", "last")),
        "points": rng.choice((60, 100)),
    }


def _distill_params(rng, params):
    return {
        "data": "teacher",
        "inputs": rng.choice((8, 16)),
        "width": rng.choice((32, 64, 128)),
        "temperature": rng.choice((1.0, 2.0, 4.0)),
        "batch": rng.choice((32, 64, 128)),
        "steps": rng.choice((1500, 3000, 5000)),
        "schedule": rng.choice(("constant", "step", "cosine")),
        "points": rng.choice((50, 80)),
    }


def _resnet_params(rng, params):
    return {
        "opt": "sgd",
        "lr": log_uniform(rng, 0.02, 0.2),
        "wd": 5e-4,
        "data": "shapes-augmented",
        "channels": rng.choice((8, 12)),
        "batch": rng.choice((64, 128)),
        "epochs": rng.choice((20, 30, 40)),
        "train": 1200,
        "schedule": "step",
    }


FAMILY_PARAMS = {
    "autoencoder": _autoencoder_params,
    "ppl-convlm": _convlm_params,
    "noisy-logreg": _logreg_params,
    "distill": _distill_params,
    "resnet-epochs": _resnet_params,
}


class ConvLanguageModel(nn.Module):
    """A causal dilated 1-D convolution stack (WaveNet-like, residual, GELU) over character embeddings."""

    def __init__(self, *, vocab: int, dim: int, blocks: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.convs = nn.ModuleList(nn.Conv1d(dim, dim, 3, dilation=2**b) for b in range(blocks))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            pad = 2 * conv.dilation[0]
            out = conv(functional.pad(norm(hidden).transpose(1, 2), (pad, 0))).transpose(1, 2)
            hidden = hidden + functional.gelu(out)
        return self.head(hidden)


class ResidualNet(nn.Module):
    """A stem, two residual blocks with batch norm (the second strided), global pooling and a classifier."""

    def __init__(self, *, channels: int, classes: int):
        super().__init__()

        def block(width: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
            )

        self.stem = nn.Sequential(nn.Conv2d(1, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.first = block(channels)
        self.down = nn.Sequential(
            nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1), nn.BatchNorm2d(2 * channels)
        )
        self.second = block(2 * channels)
        self.head = nn.Linear(2 * channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = functional.relu(x + self.first(x))
        x = functional.relu(self.down(x))
        x = functional.relu(x + self.second(x))
        return self.head(x.mean((2, 3)))


def _noisy_linear(features: int, flip: float) -> tuple:
    from sklearn import datasets

    x, y = datasets.make_classification(
        n_samples=6000,
        n_features=features,
        n_informative=features // 2,
        n_classes=3,
        flip_y=flip,
        class_sep=0.8,
        random_state=features,
    )
    return data._split((x - x.mean(0)) / x.std(0), y)


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random flips and shifts of up to 2 pixels (a crop of the padded image), the usual image augmentation."""
    flip = torch.rand(len(x), generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    dy, dx = torch.randint(-2, 3, (2,), generator=gen).tolist()
    return torch.roll(x, shifts=(dy, dx), dims=(2, 3))


def _teacher(inputs: int, temperature: float) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(inputs * 1000 + int(temperature * 10))
    net = mlp(inputs, 96, 10, depth=3, act="tanh")
    for p in net.parameters():
        p.requires_grad_(False)
    return lambda x: functional.softmax(net(x) * 3 / temperature, -1)


def build(family: str, params: dict) -> Task:
    torch.manual_seed(params["seed"])
    gen = torch.Generator().manual_seed(params["seed"])
    steps, points = params.get("steps", 0), params.get("points", 60)
    if family == "autoencoder":
        x, _, xv, _ = data.digits_flat() if params["data"] == "digits" else data.shapes()
        x, xv = x.reshape(len(x), -1), xv.reshape(len(xv), -1)
        size = x.shape[1]
        net = nn.Sequential(
            mlp(size, params["width"], params["bottleneck"], depth=1, act="gelu"),
            mlp(params["bottleneck"], params["width"], size, depth=1, act="gelu"),
        )
        draw = sampler(x, x, params["batch"], gen)

        def noisy(step: int) -> tuple:
            bx, by = draw(step)
            return bx + params["noise"] * torch.randn(bx.shape, generator=gen), by

        return Task(
            net,
            noisy,
            lambda m, bx, by: functional.mse_loss(m(bx), by),
            lambda m: (functional.mse_loss(m(xv), xv).item(), None),
            every(steps, points),
            len(x),
        )
    if family == "ppl-convlm":
        held = torch.Generator().manual_seed(TEXT_SEED)
        val = data.sequences("charlm", 256, params["length"], held, held=True)
        return Task(
            ConvLanguageModel(vocab=128, dim=params["dim"], blocks=params["blocks"]),
            lambda step: data.sequences("charlm", params["batch"], params["length"], gen),
            lambda m, bx, by, mask: classify(m, bx, by, mask)[0],
            lambda m: (lambda loss, acc: (loss.item(), acc))(*classify(m, *val)),
            every(steps, points),
            1000,
        )
    if family == "noisy-logreg":
        x, y, xv, yv = _noisy_linear(params["features"], params["flip"])
        return Task(
            nn.Linear(params["features"], 3),
            sampler(x, y, params["batch"], gen),
            lambda m, bx, by: classify(m, bx, by)[0],
            lambda m: (lambda loss, acc: (loss.item(), acc))(*classify(m, xv, yv)),
            every(steps, points),
            len(x),
        )
    if family == "distill":
        teacher = _teacher(params["inputs"], params["temperature"])
        xv = torch.randn(2000, params["inputs"], generator=torch.Generator().manual_seed(TEXT_SEED))
        soft_v = teacher(xv)

        def distill_loss(m, bx, soft):
            return functional.kl_div(functional.log_softmax(m(bx), -1), soft, reduction="batchmean")

        def draw_teacher(step: int) -> tuple:
            bx = torch.randn(params["batch"], params["inputs"], generator=gen)
            return bx, teacher(bx)

        def evaluate(m):
            out = m(xv)
            agree = (out.argmax(-1) == soft_v.argmax(-1)).float().mean().item()
            return distill_loss(m, xv, soft_v).item(), agree

        return Task(
            mlp(params["inputs"], params["width"], 10, depth=2, act="relu"),
            draw_teacher,
            distill_loss,
            evaluate,
            every(steps, points),
            10_000,
        )
    x, y, xv, yv = data.shapes()
    x, y = x[: params["train"]], y[: params["train"]]
    draw = sampler(x, y, params["batch"], gen)
    per_epoch = math.ceil(params["train"] / params["batch"])
    params["steps"] = params["epochs"] * per_epoch

    def augmented(step: int) -> tuple:
        bx, by = draw(step)
        return _augment(bx, gen), by

    return Task(
        ResidualNet(channels=params["channels"], classes=len(data.SHAPES)),
        augmented,
        lambda m, bx, by: classify(m, bx, by)[0],
        lambda m: (lambda loss, acc: (loss.item(), acc))(*classify(m, xv, yv)),
        set(range(per_epoch, params["steps"] + 1, per_epoch)),
        len(x),
    )


def perplexity(points: list[dict]) -> list[dict]:
    """The printed losses as a language-model script prints them: perplexity, exp of the mean cross-entropy."""
    return [
        p | {"loss": _finite(math.exp(min(50.0, p["loss"]))), "val_loss": _finite(math.exp(min(50.0, p["val_loss"])))}
        for p in points
    ]


def _shown(points: list[dict], params: dict) -> list[dict]:
    """What a run printed: the language model's loss as perplexity."""
    return perplexity(points) if params.get("ppl") else points


def main(argv: list[str] | None = None) -> None:
    record_runs(
        argv,
        description=__doc__.splitlines()[0],
        default_runs=100,
        default_out=DATA,
        prefix="families2",
        prepare=lambda: recorder(run_params, build, points=_shown),
    )


if __name__ == "__main__":
    main()
