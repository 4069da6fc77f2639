"""A PyTorch training script that survives moves: checkpoints, resumes, and saves on SIGTERM.

Submit with `"command": "python3 -m trainmaster_examples.pytorch_train --steps 2000"` (the agent puts this package
and the helper on every task's PYTHONPATH; the cluster's default engine brings PyTorch) and a metric
{"name": "loss", "regex": "loss (?P<value>[0-9.e-]+)", "target": 0.01}: at its default learning rate (0.05) the
loss passes 0.01 near step 870 and ends near 0.005 (the data's noise, 0.05², bounds it at 0.0025); `--lr` (or the
environment variable `lr`, as a search sets it) changes the rate.
"""

import argparse
import os

import torch
from torch import nn

import trainmaster_task as tm

NOISE = 0.05  # the targets' noise: no model gets the mean squared error below NOISE² (0.0025)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=float(os.environ.get("lr", "0.05")))  # noqa: SIM112 (a parameter, by its name)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    args = parser.parse_args()

    torch.manual_seed(0)
    inputs = torch.randn(1024, 16)
    targets = inputs @ torch.randn(16, 1) + NOISE * torch.randn(1024, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    path = tm.checkpoint_dir() / "model.pt"
    start = 0
    if path.exists():
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        print(f"resumed from step {state['step']} (attempt {tm.attempt()})", flush=True)

    for step in range(start, args.steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.checkpoint_every == 0 or tm.stop_requested() or step == args.steps - 1:
            tmp = path.with_name("model.pt.tmp")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, path)
        if tm.stop_requested():
            print(f"saved at step {step}; exiting for the move", flush=True)
            return


if __name__ == "__main__":
    main()
