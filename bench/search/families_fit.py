"""One training loop for every new family: a batch per step, an optimiser under a learning-rate schedule, and a
point written at chosen steps the way a real job prints (`t` is the wall time of the printed line, as in
`record.py` and `broad.py`). The printed loss is the mean since the last line (`avg`), the last batch's loss
(`last`, noisy) or an exponential moving average (`ema`)."""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bench.search.families_models import multiplier, optimizer
from bench.search.record import _finite


@dataclass
class Printed:
    """The training loss a script prints: `avg` since the last line, `last` batch, or `ema` with `beta`."""

    kind: str = "avg"
    beta: float = 0.98
    total: float = 0.0
    count: int = 0
    ema: float | None = None
    last: float = 0.0

    def add(self, value: float) -> None:
        value = value if math.isfinite(value) else 1e3
        self.total, self.count = self.total + value, self.count + 1
        self.ema = value if self.ema is None else self.beta * self.ema + (1 - self.beta) * value
        self.last = value

    def line(self) -> float:
        value = {"avg": self.total / max(1, self.count), "last": self.last, "ema": self.ema}[self.kind]
        self.total, self.count = 0.0, 0
        return value


@dataclass
class Task:
    """What a family hands the loop: a model, its batches, its loss, its validation, when it prints."""

    model: torch.nn.Module
    draw: Callable[[int], tuple]  # step -> (inputs, targets[, mask])
    loss: Callable[..., torch.Tensor]  # (model, *batch) -> scalar loss
    evaluate: Callable[[torch.nn.Module], tuple]  # model -> (val_loss, val_acc or None)
    marks: set[int]  # the steps after which a line is printed
    train_size: int  # samples an epoch is made of
    on_step: Callable[[int], None] = field(default=lambda step: None)  # a mid-run change (unfreeze, slow input)


def fit(task: Task, params: dict) -> dict:
    """Train for `params["steps"]` steps; the points and the wall time, in `broad.py`'s shape."""
    steps = params["steps"]
    opt = optimizer(
        params["opt"], [p for p in task.model.parameters()], lr=params["lr"], weight_decay=params.get("wd", 0.0)
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        opt, multiplier(params.get("schedule", "constant"), steps, warmup=params.get("warmup", 0))
    )
    printed = Printed(params.get("printed", "avg"), params.get("ema", 0.98))
    points, seen, start = [], 0, time.monotonic()
    for step in range(1, steps + 1):
        task.on_step(step)
        batch = task.draw(step)
        task.model.train()
        opt.zero_grad()
        loss = task.loss(task.model, *batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(task.model.parameters(), 5.0)
        opt.step()
        scheduler.step()
        printed.add(loss.item())
        seen += len(batch[1])
        if step in task.marks or step == steps:
            task.model.eval()
            with torch.no_grad():
                val_loss, val_acc = task.evaluate(task.model)
            points.append(
                {
                    "t": round(time.monotonic() - start, 4),
                    "step": step,
                    "epoch": round(seen / task.train_size, 4),
                    "loss": _finite(printed.line()),
                    "val_loss": _finite(val_loss),
                    "val_acc": round(val_acc, 4) if val_acc is not None else None,
                }
            )
    return {"points": points, "wall_s": round(time.monotonic() - start, 4)}


def every(steps: int, points: int) -> set[int]:
    """Evenly spaced print steps, about `points` of them."""
    gap = max(1, math.ceil(steps / points))
    return set(range(gap, steps + 1, gap))


def classify(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None):
    """Cross-entropy (and the accuracy) of a classifier or, with `mask`, of a next-token model on masked positions."""
    logits = model(x)
    if mask is not None:
        logits, y = logits[mask], y[mask]
    loss = torch.nn.functional.cross_entropy(logits, y)
    return loss, (logits.argmax(-1) == y).float().mean().item()


def recorder(
    run_params: Callable[[int], tuple[str, dict]],
    build: Callable[[str, dict], Task],
    *,
    points: Callable[[list[dict], dict], list[dict]] | None = None,
) -> Callable[[int], tuple[dict, str]]:
    """One recorded run of a family sweep (`record.record_runs`' `prepare`): the index's family and parameters,
    trained (`points` rewrites what was printed, e.g. a loss shown as perplexity), in the recorded files' shape,
    with its summary line."""

    def one(index: int) -> tuple[dict, str]:
        family, params = run_params(index)
        result = fit(build(family, params), params)
        if points is not None:
            result["points"] = points(result["points"], params)
        last = result["points"][-1]
        summary = (
            f"{family} {params} wall={result['wall_s']:.2f}s points={len(result['points'])} "
            f"loss={last['loss']:.4f} val_acc={last['val_acc']}"
        )
        return {"group": family, "family": family, "params": params, **result, "epochs": last["epoch"]}, summary

    return one
