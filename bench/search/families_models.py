"""The small networks of the new families: a convolutional net, a causal transformer, a GRU language model, MLPs and a
matrix factorisation; and the optimisers and learning-rate schedules they train with."""

import math

import torch
from torch import nn


def conv_net(*, channels: int, depth: int, size: int, classes: int, norm: bool) -> nn.Module:
    """`depth` blocks of 3x3 convolution (batch norm optional), ReLU and 2x2 pooling, then a linear classifier."""
    layers, width = [], 1
    for block in range(depth):
        out = channels * 2**block
        layers += [
            nn.Conv2d(width, out, 3, padding=1),
            *([nn.BatchNorm2d(out)] if norm else []),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        width, size = out, size // 2
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width * size * size, classes))


class CausalTransformer(nn.Module):
    """Token and position embeddings, pre-norm encoder layers under a causal mask, a next-token head."""

    def __init__(self, *, vocab: int, dim: int, heads: int, layers: int, length: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Parameter(torch.randn(length, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length)
        hidden = self.encoder(self.embed(tokens) + self.position[:length], mask=mask, is_causal=True)
        return self.head(hidden)


class GruLanguageModel(nn.Module):
    def __init__(self, *, vocab: int, dim: int, hidden: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(tokens))[0])


def mlp(inputs: int, width: int, outputs: int, *, depth: int = 2, act: str = "relu", dropout: float = 0.0):
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}
    layers, size = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(size, width), acts[act](), *([nn.Dropout(dropout)] if dropout else [])]
        size = width
    return nn.Sequential(*layers, nn.Linear(size, outputs))


class Factorisation(nn.Module):
    """A recommender's rating: user and item embeddings' dot product plus their biases."""

    def __init__(self, *, users: int, items: int, rank: int):
        super().__init__()
        self.users, self.items = nn.Embedding(users, rank), nn.Embedding(items, rank)
        self.user_bias, self.item_bias = nn.Embedding(users, 1), nn.Embedding(items, 1)
        for table in (self.users, self.items):
            nn.init.normal_(table.weight, 0, 0.1)
        for table in (self.user_bias, self.item_bias):
            nn.init.zeros_(table.weight)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        u, i = pairs[:, 0], pairs[:, 1]
        return (self.users(u) * self.items(i)).sum(1) + self.user_bias(u)[:, 0] + self.item_bias(i)[:, 0]


def optimizer(name: str, parameters, *, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay or 0.01)
    return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay)


def multiplier(schedule: str, steps: int, *, warmup: int = 0):
    """The learning rate's factor at a step: `constant`, `warmup` (linear ramp, then flat), `step` (x0.1 at 50%
    and 75%), `cosine`, or `warmup-cosine`."""

    def factor(step: int) -> float:
        if warmup and step < warmup and schedule in ("warmup", "warmup-cosine"):
            return (step + 1) / warmup
        if schedule == "step":
            return 0.1 ** ((step >= steps // 2) + (step >= 3 * steps // 4))
        if schedule in ("cosine", "warmup-cosine"):
            start = warmup if schedule == "warmup-cosine" else 0
            done = min(1.0, (step - start) / max(1, steps - start))
            return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * done))
        return 1.0

    return factor
