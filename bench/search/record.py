"""Record a sweep of small real PyTorch trainings (scikit-learn's bundled digits) with their true wall timing.

Each run is one line of `data/sweep.jsonl.gz` (one gzip member per line, appended as it finishes, so an
interrupted recording resumes where it stopped):
`{"run", "group", "params": {"lr", "width", "batch", "seed", "opt"}, "points": [{"t", "step", "epoch", "loss",
"val_loss", "val_acc"}], "wall_s", "epochs", "machine"}`. `t` is seconds since the run's start, measured, not
simulated: the machine's load changes the pace, as it does for real jobs.

    nice -n 10 .venv/bin/python -m bench.search.record --runs 400 --until 19:20
"""

import argparse
import gzip
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn

DATA = Path(__file__).parent / "data" / "sweep.jsonl.gz"
GROUPS = ("digits-mlp", "digits-cnn", "digits-deep")
DEEP_FROM = 240  # runs from this index on include the deep family (slower, power-law-like loss tails)
MAX_POINTS = 60
LR_RANGE = {"sgd": (3e-3, 0.5), "adam": (2e-4, 3e-2)}


def run_params(index: int) -> tuple[str, dict, int]:
    """The group, parameters and epoch count of run `index` (deterministic, so a resumed sweep is the same)."""
    rng = random.Random(zlib.crc32(f"sweep-{index}".encode()))
    draw = rng.random()
    group = GROUPS[0] if draw < 0.6 else GROUPS[1]
    if index >= DEEP_FROM:
        group = GROUPS[0] if draw < 0.4 else GROUPS[1] if draw < 0.7 else GROUPS[2]
    opt = rng.choice(("sgd", "adam"))
    low, high = LR_RANGE[opt]
    lr = math.exp(rng.uniform(math.log(low), math.log(high)))
    params = {
        "lr": round(lr, 6),
        "width": rng.choice((16, 32, 64, 128)),
        "batch": rng.choice((16, 32, 64, 128)),
        "seed": rng.randrange(5),
        "opt": opt,
    }
    base = rng.choice((6, 8, 10, 15)) if group == "digits-cnn" else rng.choice((10, 15, 20, 30))
    epochs = max(4, round(base * math.sqrt(params["batch"] / 32)))  # larger batches: cheaper epochs, more of them
    return group, params, epochs


def split_digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits scaled to [0, 1], 80/20 split fixed across runs."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(x))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def build(group: str, width: int) -> nn.Module:
    if group == "digits-mlp":
        return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    if group == "digits-deep":  # four tanh layers: training starts slowly and its loss decays like a power law
        layers = [nn.Linear(64, width), nn.Tanh()]
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.Tanh()]
        return nn.Sequential(*layers, nn.Linear(width, 10))
    channels = max(4, width // 4)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(channels, channels, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(channels * 16, 10),
    )


def train(group: str, params: dict, epochs: int, data: tuple) -> dict:
    """One training run; a point every `steps // MAX_POINTS` steps (train loss averaged since the last point)."""
    x_train, y_train, x_val, y_val = data
    torch.manual_seed(params["seed"])
    model = build(group, params["width"])
    optimizer = (
        torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=0.9)
        if params["opt"] == "sgd"
        else torch.optim.Adam(model.parameters(), lr=params["lr"])
    )
    loss_fn = nn.CrossEntropyLoss()
    per_epoch = math.ceil(len(x_train) / params["batch"])
    every = max(1, math.ceil(per_epoch * epochs / MAX_POINTS))
    points, step, running, count = [], 0, 0.0, 0
    start = time.monotonic()
    for epoch in range(epochs):
        order = torch.randperm(len(x_train))
        for i in range(per_epoch):
            index = order[i * params["batch"] : (i + 1) * params["batch"]]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[index]), y_train[index])
            loss.backward()
            optimizer.step()
            step += 1
            value = loss.item()
            running += value if math.isfinite(value) else 1e3
            count += 1
            if step % every == 0 or step == per_epoch * epochs:
                with torch.no_grad():
                    logits = model(x_val)
                    val_loss = loss_fn(logits, y_val).item()
                    val_acc = (logits.argmax(1) == y_val).float().mean().item()
                points.append(
                    {
                        "t": round(time.monotonic() - start, 4),
                        "step": step,
                        "epoch": round(epoch + (i + 1) / per_epoch, 4),
                        "loss": _finite(running / count),
                        "val_loss": _finite(val_loss),
                        "val_acc": round(val_acc, 4),
                    }
                )
                running, count = 0.0, 0
    return {"points": points, "wall_s": round(time.monotonic() - start, 4)}


def _finite(value: float) -> float:
    """A loss as recorded: six significant digits (a loss of 3e-7 stays 3e-7; five decimals made it 0), 1e3 for
    one that diverged."""
    return float(f"{value:.6g}") if math.isfinite(value) else 1e3


def machine() -> dict:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "node": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load1": round(load, 2) if load is not None else None,
    }


def recorded(path: Path) -> set[str]:
    """Run ids already in the file; a file cut short by an interrupted write is first rewritten with its complete
    lines, so that what is appended next stays readable."""
    if not path.exists():
        return set()
    lines, broken = [], False
    try:
        with gzip.open(path, "rt") as handle:
            for line in handle:
                lines.append(line)
    except (EOFError, OSError):
        broken = True
    done, kept = set(), []
    for line in lines:
        try:
            done.add(json.loads(line)["run"])
            kept.append(line if line.endswith("\n") else line + "\n")
        except (json.JSONDecodeError, KeyError, TypeError):
            broken = True
    if broken:
        with gzip.open(path, "wt") as handle:
            handle.writelines(kept)
    return done


def record_runs(
    argv: list[str] | None,
    *,
    description: str,
    default_runs: int,
    default_out: Path,
    prefix: str,
    prepare: Callable[[], Callable[[int], tuple[dict, str]]],
) -> None:
    """A recorder's loop: `--runs`, `--until`, `--out`; runs already recorded are skipped, each new one appended as
    one JSON line. `prepare()` loads the data once and returns what trains run `index`: its line (group, params,
    points, wall_s, epochs) and a one-line summary to print."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--runs", type=int, default=default_runs, help="run indices 0..N-1 (already recorded ones skipped)"
    )
    parser.add_argument("--until", default=None, help="stop starting runs after HH:MM UTC")
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = recorded(args.out)
    one = prepare()
    deadline = _deadline(args.until)
    for index in range(args.runs):
        run = f"{prefix}-{index:04d}"
        if run in done:
            continue
        if deadline is not None and time.time() >= deadline:
            print(f"stopped at the deadline with {len(done)} runs")
            break
        line, summary = one(index)
        with gzip.open(args.out, "at") as handle:
            handle.write(json.dumps({"run": run, **line, "machine": machine()}, separators=(",", ":")) + "\n")
        done.add(run)
        print(f"{run} {summary}", flush=True)


def torch_startup_s() -> float:
    """Wall time of a fresh interpreter importing torch (what a job's first line waits for)."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return round(time.monotonic() - began, 3)


def record_family_runs(
    argv: list[str] | None,
    *,
    description: str,
    default_runs: int,
    default_out: Path,
    prefix: str,
    run_params: Callable[[int], tuple[str, dict]],
    train: Callable[[str, dict], dict],
    startup: Callable[[], float] = torch_startup_s,
) -> None:
    """`record_runs` for recorders whose run `index` is `train(*run_params(index))` (its points and wall time): each
    line with its family as group, its parameters, `startup_s` (measured once, `startup()`) and its steps as epochs."""

    def prepare() -> Callable[[int], tuple[dict, str]]:
        began = startup()

        def one(index: int) -> tuple[dict, str]:
            family, params = run_params(index)
            result = train(family, params)
            first, last = result["points"][0], result["points"][-1]
            summary = f"{family} {params} wall={result['wall_s']:.2f}s loss={first['loss']:.4g}->{last['loss']:.4g}"
            line = {"group": family, "family": family, "params": params, **result, "startup_s": began}
            return line | {"epochs": float(params["steps"])}, summary

        return one

    record_runs(
        argv,
        description=description,
        default_runs=default_runs,
        default_out=default_out,
        prefix=prefix,
        prepare=prepare,
    )


def main(argv: list[str] | None = None) -> None:
    def prepare() -> Callable[[int], tuple[dict, str]]:
        data = split_digits()

        def one(index: int) -> tuple[dict, str]:
            group, params, epochs = run_params(index)
            result = train(group, params, epochs, data)
            summary = (
                f"{group} {params} epochs={epochs} wall={result['wall_s']:.2f}s "
                f"val_acc={result['points'][-1]['val_acc']:.3f}"
            )
            return {"group": group, "params": params, **result, "epochs": epochs}, summary

        return one

    record_runs(
        argv, description=__doc__.splitlines()[0], default_runs=400, default_out=DATA, prefix="sweep", prepare=prepare
    )


def _deadline(until: str | None) -> float | None:
    if not until:
        return None
    hour, minute = (int(x) for x in until.split(":"))
    now = datetime.now(UTC)
    stop = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return stop.timestamp()


if __name__ == "__main__":
    main()
