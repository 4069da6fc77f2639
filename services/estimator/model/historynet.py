"""The history model's network and its training (torch, imported only by whoever trains: the training process);
the served model runs the same network on numpy (history.forward), so the estimator never loads torch or CUDA."""

import numpy as np
import torch
from torch import nn


class MLP(nn.Module):
    """Two heads on one input vector: log work (masked inputs) and log duration."""

    work_mask: torch.Tensor  # a buffer: saved with the weights, never trained

    def __init__(self, n_in: int, hidden: int, work_mask: list[float]) -> None:
        super().__init__()
        self.register_buffer("work_mask", torch.as_tensor(work_mask, dtype=torch.float32))
        self.work = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.duration = nn.Sequential(
            nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.work(x * self.work_mask), self.duration(x)], dim=1)


def limit_threads(threads: int) -> None:
    """Bound this process's torch to `threads` CPU threads (intra- and inter-op): a net this small trains fastest on
    one, and more only contend with the services on the machine."""
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # settable once, before any parallel work: already fixed by then
        pass


def fit(
    x: np.ndarray, target: np.ndarray, *, hidden: int, work_mask: list[float], epochs: int, seed: int
) -> dict[str, np.ndarray]:
    """Train the network on the CPU (no GPU is ever touched); returns its weights by state_dict name."""
    torch.manual_seed(seed)
    inputs, goal = torch.from_numpy(x), torch.tensor(target, dtype=torch.float32)
    model = MLP(x.shape[1], hidden, work_mask)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    for _ in range(epochs):
        opt.zero_grad()
        loss = nn.functional.smooth_l1_loss(model(inputs), goal, beta=0.1)
        loss.backward()
        opt.step()
    return {name: value.detach().numpy().copy() for name, value in model.state_dict().items()}
