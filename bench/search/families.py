"""Families of small real trainings unlike the digits sweep and `broad.py`'s runs, held out by family (issue 31,
item 5): convolutional nets on images, causal transformers and a GRU on sequences and text, optimisers under
learning-rate schedules, accuracy read once an epoch, noisy and smoothed printed losses, and runs whose pace changes
mid-way. One line per run in `data/families.jsonl.gz`, `broad.py`'s shape plus `family` (the run's group); `params`
has `steps`, `printed` (`avg`, `last` or `ema`), `schedule`, and `mean` where the printed loss is smoothed already
(an EMA's equivalent running-mean window, (1 + beta) / (1 - beta)).

    nice -n 15 .venv/bin/python -m bench.search.families --runs 700 --until 18:35
"""

import math
import random
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional

from bench.search import families_data as data
from bench.search.families_fit import Task, classify, every, recorder
from bench.search.families_models import CausalTransformer, Factorisation, GruLanguageModel, conv_net, mlp
from bench.search.record import record_runs

DATA = Path(__file__).parent / "data" / "families.jsonl.gz"
FAMILIES = ("conv-images", "attention-seq", "gru-text", "sched-spirals", "epoch-acc", "noisy-ema", "pace-shift")
LR = {"sgd": (5e-3, 0.2), "adam": (3e-4, 1e-2), "adamw": (3e-4, 1e-2)}
VAL_SEQUENCES = 256


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))), 6)


def run_params(index: int) -> tuple[str, dict]:
    """The family and parameters of run `index` (deterministic, so a resumed recording is the same); the families
    take turns, so a short recording has some of each."""
    rng = random.Random(zlib.crc32(f"families-{index}".encode()))
    family = FAMILIES[index % len(FAMILIES)]
    opt = rng.choice(("sgd", "adam", "adamw"))
    params = {
        "opt": opt,
        "lr": log_uniform(rng, *LR[opt]),
        "seed": rng.randrange(5),
        "printed": "avg",
        "schedule": "constant",
    }
    return family, params | FAMILY_PARAMS[family](rng, params)


def _conv_params(rng, params):
    batch = rng.choice((16, 32, 64, 128))
    image = rng.choice(("shapes", "shapes", "digits-shift"))
    epochs = round(rng.choice((15, 25, 40)) * math.sqrt(batch / 32))  # larger batches: cheaper epochs, more of them
    train = 2400 if image == "shapes" else 1437
    return {
        "data": image,
        "batch": batch,
        "channels": rng.choice((4, 8, 16)),
        "norm": rng.random() < 0.5,
        "schedule": rng.choice(("constant", "cosine", "step")),
        "steps": epochs * math.ceil(train / batch),
        "points": rng.choice((40, 60, 80)),
    }


def _attention_params(rng, params):
    task = rng.choice(("copy", "sort", "parity", "charlm"))
    length = {
        "copy": rng.choice((6, 8, 10)),
        "sort": rng.choice((6, 8, 10)),
        "parity": rng.choice((12, 16, 24)),
        "charlm": rng.choice((32, 48)),
    }[task]
    steps = rng.choice((400, 700, 1000, 1500))
    lr = log_uniform(rng, 0.01, 0.1) if params["opt"] == "sgd" else log_uniform(rng, 3e-4, 3e-3)
    return {
        "data": task,
        "length": length,
        "dim": rng.choice((32, 48)),
        "heads": rng.choice((2, 4)),
        "layers": rng.choice((1, 2)),
        "batch": rng.choice((16, 32, 64)),
        "steps": steps,
        "lr": lr,
        "schedule": rng.choice(("warmup", "warmup-cosine", "constant")),
        "warmup": steps // 10,
        "points": rng.choice((50, 80, 100)),
    }


def _gru_params(rng, params):
    return {
        "data": "charlm",
        "length": rng.choice((32, 64)),
        "dim": rng.choice((16, 32)),
        "hidden": rng.choice((64, 96)),
        "layers": rng.choice((1, 2)),
        "batch": rng.choice((16, 32)),
        "steps": rng.choice((250, 400, 600)),
        "schedule": rng.choice(("constant", "step", "cosine")),
        "lr": log_uniform(rng, 0.05, 1.0) if params["opt"] == "sgd" else log_uniform(rng, 1e-3, 1e-2),
        "points": rng.choice((40, 60)),
    }


def _spiral_params(rng, params):
    steps = rng.choice((1500, 2500, 4000, 6000))
    return {
        "data": "spirals",
        "width": rng.choice((32, 64, 128)),
        "depth": rng.choice((2, 3)),
        "act": rng.choice(("relu", "tanh", "gelu")),
        "batch": rng.choice((32, 64, 128)),
        "steps": steps,
        "schedule": rng.choice(("warmup", "step", "cosine", "warmup-cosine")),
        "warmup": steps // rng.choice((8, 12, 20)),
        "points": 60,
    }


def _epoch_params(rng, params):
    batch = rng.choice((32, 64, 128))
    epochs = rng.choice((25, 30, 40, 50))
    return {
        "data": "wide",
        "width": rng.choice((64, 128, 256)),
        "dropout": rng.choice((0.0, 0.2)),
        "batch": batch,
        "epochs": epochs,
        "steps": epochs * math.ceil(9600 / batch),
        "schedule": rng.choice(("constant", "cosine", "step")),
        "lr": round(params["lr"] / 2, 6),
    }


def _noisy_params(rng, params):
    data_set = rng.choice(("ratings", "digits"))
    smoothed = (
        {"printed": "last"}
        if rng.random() < 0.4
        else {
            "printed": "ema",
            "ema": (beta := rng.choice((0.9, 0.95, 0.98, 0.99))),
            "mean": round((1 + beta) / (1 - beta)),
        }
    )
    extra = {"rank": rng.choice((4, 8, 16))} if data_set == "ratings" else {"width": rng.choice((32, 64))}
    lr = params["lr"] * (3 if data_set == "ratings" and params["opt"] != "sgd" else 0.5)
    return {
        "data": data_set,
        "batch": rng.choice((4, 8, 16)),
        "steps": rng.choice((6000, 10000, 15000)),
        "points": rng.choice((100, 150, 200)),
        "lr": round(lr, 6),
        **smoothed,
        **extra,
    }


def _pace_params(rng, params):
    shift = rng.choice(("unfreeze", "batch-ramp", "print-change", "throttle"))
    extra = {
        "unfreeze": {"data": "shapes", "channels": rng.choice((8, 12)), "batch": 32, "steps": 1500},
        "batch-ramp": {
            "data": "wide",
            "width": rng.choice((64, 128)),
            "batch": rng.choice((16, 32)),
            "steps": rng.choice((6000, 9000)),
        },
        "print-change": {
            "data": "spirals",
            "width": 64,
            "batch": 64,
            "steps": rng.choice((4000, 6000)),
            "slower": rng.choice((0.25, 3)),
        },
        "throttle": {
            "data": "digits-shift",
            "channels": 8,
            "batch": 32,
            "steps": rng.choice((900, 1350)),
            "pause": rng.choice((0.002, 0.004, 0.008)),
        },
    }[shift]
    return {"shift": shift, "at": rng.choice((0.3, 0.4, 0.5, 0.6)), "points": 60, **extra}


FAMILY_PARAMS = {
    "conv-images": _conv_params,
    "attention-seq": _attention_params,
    "gru-text": _gru_params,
    "sched-spirals": _spiral_params,
    "epoch-acc": _epoch_params,
    "noisy-ema": _noisy_params,
    "pace-shift": _pace_params,
}


def sampler(x: torch.Tensor, y: torch.Tensor, batch: int | Callable[[int], int], gen: torch.Generator):
    """Shuffled minibatches, epoch after epoch; `batch` may change with the step."""
    state = {"order": torch.randperm(len(x), generator=gen), "at": 0}

    def draw(step: int) -> tuple:
        size = batch(step) if callable(batch) else batch
        if state["at"] + size > len(x):
            state["order"], state["at"] = torch.randperm(len(x), generator=gen), 0
        index = state["order"][state["at"] : state["at"] + size]
        state["at"] += size
        return x[index], y[index]

    return draw


def image_set(name: str) -> tuple:
    return data.shapes() if name == "shapes" else data.shifted_digits()


def supervised(model, sets: tuple, params: dict, gen, *, marks=None, batch=None, on_step=None) -> Task:
    x, y, xv, yv = sets
    regression = y.dtype.is_floating_point

    def loss(m, bx, by):
        return functional.mse_loss(m(bx).reshape(by.shape), by) if regression else classify(m, bx, by)[0]

    def evaluate(m):
        if regression:
            return functional.mse_loss(m(xv).reshape(yv.shape), yv).item(), None
        val_loss, acc = classify(m, xv, yv)
        return val_loss.item(), acc

    return Task(
        model,
        sampler(x, y, batch or params["batch"], gen),
        loss,
        evaluate,
        marks or every(params["steps"], params["points"]),
        len(x),
        on_step or (lambda step: None),
    )


def sequence_task(model, params: dict, gen) -> Task:
    held = torch.Generator().manual_seed(12345)
    val = data.sequences(params["data"], VAL_SEQUENCES, params["length"], held, held=True)

    def evaluate(m):
        val_loss, acc = classify(m, *val)
        return val_loss.item(), acc

    return Task(
        model,
        lambda step: data.sequences(params["data"], params["batch"], params["length"], gen),
        lambda m, x, y, mask: classify(m, x, y, mask)[0],
        evaluate,
        every(params["steps"], params["points"]),
        1000,
    )


def build(family: str, params: dict) -> Task:
    """The model, data and print steps of a run."""
    torch.manual_seed(params["seed"])
    gen = torch.Generator().manual_seed(params["seed"])
    if family == "conv-images":
        sets = image_set(params["data"])
        net = conv_net(
            channels=params["channels"],
            depth=2,
            size=sets[0].shape[-1],
            classes=int(sets[1].max()) + 1,
            norm=params["norm"],
        )
        return supervised(net, sets, params, gen)
    if family == "attention-seq":
        vocab = 128 if params["data"] == "charlm" else 12
        return sequence_task(
            CausalTransformer(
                vocab=vocab,
                dim=params["dim"],
                heads=params["heads"],
                layers=params["layers"],
                length=2 * params["length"],
            ),
            params,
            gen,
        )
    if family == "gru-text":
        return sequence_task(
            GruLanguageModel(vocab=128, dim=params["dim"], hidden=params["hidden"], layers=params["layers"]),
            params,
            gen,
        )
    if family == "sched-spirals":
        return supervised(
            mlp(2, params["width"], 2, depth=params["depth"], act=params["act"]), data.spirals(), params, gen
        )
    if family == "epoch-acc":
        per_epoch = math.ceil(9600 / params["batch"])
        return supervised(
            mlp(40, params["width"], 6, dropout=params["dropout"]),
            data.wide_classification(),
            params,
            gen,
            marks=set(range(per_epoch, params["steps"] + 1, per_epoch)),
        )
    if family == "noisy-ema":
        if params["data"] == "ratings":
            return supervised(Factorisation(users=600, items=400, rank=params["rank"]), data.ratings(), params, gen)
        return supervised(mlp(64, params["width"], 10), data.digits_flat(), params, gen)
    return pace_shift(params, gen)


def pace_shift(params: dict, gen) -> Task:
    """A run whose pace changes at `at` of its steps: the convolutions unfrozen, the batch made 4x larger, the
    lines printed more or less often, or the input slowed (a pause per step, as when another tenant takes the
    disk)."""
    shift, switch = params["shift"], round(params["at"] * params["steps"])
    if shift == "unfreeze":
        net = conv_net(channels=params["channels"], depth=2, size=16, classes=len(data.SHAPES), norm=False)
        convolutions = [p for layer in list(net)[:-1] for p in layer.parameters()]

        def unfreeze(step):
            for p in convolutions:
                p.requires_grad_(step > switch)

        return supervised(net, data.shapes(), params, gen, on_step=unfreeze)
    if shift == "batch-ramp":
        return supervised(
            mlp(40, params["width"], 6),
            data.wide_classification(),
            params,
            gen,
            batch=lambda step: params["batch"] * (4 if step > switch else 1),
        )
    if shift == "print-change":
        before = every(switch, round(params["points"] * params["at"]))
        gap = max(1, round(min(before) * params["slower"]))
        return supervised(
            mlp(2, params["width"], 2),
            data.spirals(),
            params,
            gen,
            marks=before | set(range(switch + gap, params["steps"] + 1, gap)),
        )
    net = conv_net(channels=params["channels"], depth=2, size=12, classes=10, norm=True)
    return supervised(
        net,
        data.shifted_digits(),
        params,
        gen,
        on_step=lambda step: time.sleep(params["pause"]) if step > switch else None,
    )


def main(argv: list[str] | None = None) -> None:
    record_runs(
        argv,
        description=__doc__.splitlines()[0],
        default_runs=700,
        default_out=DATA,
        prefix="families",
        prepare=lambda: recorder(run_params, build),
    )


if __name__ == "__main__":
    main()
