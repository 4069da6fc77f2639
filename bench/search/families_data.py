"""The data the new families train on, all made or read on this machine (nothing downloaded): synthetic shape images,
digits shifted on a larger canvas, synthetic sequence tasks, Python's own standard-library sources as text, two
spirals, a larger synthetic classification, and a low-rank ratings matrix. Fixed seeds: every run sees the same data.
"""

import argparse
import collections
import functools
import inspect
import json.decoder
import textwrap
from pathlib import Path

import numpy as np
import torch
from sklearn import datasets

SHAPES = ("disk", "ring", "square", "triangle", "plus", "cross")
TEXT_MODULES = (argparse, collections, functools, inspect, json.decoder, textwrap)  # ~250 kB of plain ASCII code
SEP = 1  # the separator token of the copy and sort tasks; symbols start at 2


def _split(x: np.ndarray, y: np.ndarray, *, label_dtype=torch.long) -> tuple:
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))
    as_x = functools.partial(torch.tensor, dtype=torch.float32)
    as_y = functools.partial(torch.tensor, dtype=label_dtype)
    return as_x(x[order[:cut]]), as_y(y[order[:cut]]), as_x(x[order[cut:]]), as_y(y[order[cut:]])


def shape(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """One noisy image of a shape at a random place, size and brightness."""
    r = rng.uniform(size * 0.18, size * 0.36)
    cy, cx = rng.uniform(r, size - r, 2)
    yy, xx = np.mgrid[:size, :size].astype(float)
    dy, dx = yy - cy, xx - cx
    dist = np.hypot(dy, dx)
    width = max(1.0, r / 3)
    mask = {
        "disk": dist <= r,
        "ring": np.abs(dist - r) <= width / 2 + 0.3,
        "square": (np.abs(dy) <= r) & (np.abs(dx) <= r),
        "triangle": (dy <= r) & (dy >= -r) & (np.abs(dx) <= (dy + r) / 2),
        "plus": ((np.abs(dy) <= width / 2) | (np.abs(dx) <= width / 2)) & (np.maximum(abs(dy), abs(dx)) <= r),
        "cross": ((np.abs(dy - dx) <= width / 1.4) | (np.abs(dy + dx) <= width / 1.4)) & (dist <= r * 1.2),
    }[kind]
    return mask * rng.uniform(0.5, 1.0) + rng.normal(0, 0.25, (size, size))


@functools.cache
def shapes(size: int = 16, n: int = 3000) -> tuple:
    """(x train, y train, x val, y val) of `n` noisy shape images, one channel, `size` pixels a side."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, len(SHAPES), n)
    x = np.stack([shape(SHAPES[k], size, rng) for k in y])[:, None]
    return _split(x, y)


@functools.cache
def shifted_digits(size: int = 12) -> tuple:
    """scikit-learn's 8x8 digits placed at a random offset on a `size`-pixel canvas (translation to learn)."""
    x, y = datasets.load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    canvas = np.zeros((len(x), 1, size, size))
    for i, (oy, ox) in enumerate(rng.integers(0, size - 7, (len(x), 2))):
        canvas[i, 0, oy : oy + 8, ox : ox + 8] = x[i].reshape(8, 8) / 16.0
    return _split(canvas, y)


@functools.cache
def spirals(n: int = 2000, turns: float = 1.75, noise: float = 0.08) -> tuple:
    """Two interleaved spirals: a small MLP learns them slowly, through plateaus."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, n)
    angle = np.sqrt(rng.uniform(0, 1, n)) * turns * 2 * np.pi
    x = np.stack([angle * np.cos(angle + np.pi * y), angle * np.sin(angle + np.pi * y)], 1) / (turns * 2 * np.pi)
    return _split(x + rng.normal(0, noise, x.shape), y)


@functools.cache
def wide_classification(n: int = 12000) -> tuple:
    """A larger synthetic classification (40 features, 6 classes, 8% labels flipped): slower epochs."""
    x, y = datasets.make_classification(
        n_samples=n, n_features=40, n_informative=16, n_classes=6, n_clusters_per_class=2, flip_y=0.08, random_state=0
    )
    return _split((x - x.mean(0)) / x.std(0), y)


@functools.cache
def ratings(users: int = 600, items: int = 400, rank: int = 6, n: int = 40000) -> tuple:
    """Observed (user, item) pairs of a noisy low-rank matrix, as a recommender's training set."""
    rng = np.random.default_rng(0)
    truth = rng.normal(0, 1, (users, rank)) @ rng.normal(0, 1, (rank, items)) / np.sqrt(rank)
    pairs = np.stack([rng.integers(0, users, n), rng.integers(0, items, n)], 1)
    values = truth[pairs[:, 0], pairs[:, 1]] + rng.normal(0, 0.3, n)
    order = rng.permutation(n)
    cut = int(0.8 * n)
    p, v = torch.tensor(pairs[order]), torch.tensor(values[order], dtype=torch.float32)
    return p[:cut], v[:cut], p[cut:], v[cut:]


@functools.cache
def digits_flat() -> tuple:
    x, y = datasets.load_digits(return_X_y=True)
    return _split(x / 16.0, y)


@functools.cache
def text() -> torch.Tensor:
    """Python's own standard-library sources as one ASCII byte stream."""
    raw = "\n".join(Path(m.__file__).read_text(encoding="utf-8") for m in TEXT_MODULES)
    return torch.tensor([min(ord(c), 127) for c in raw], dtype=torch.long)


def sequences(task: str, batch: int, length: int, gen: torch.Generator, *, held: bool = False) -> tuple:
    """(tokens, next-token targets, loss mask) of a synthetic task for a causal model: `copy` and `sort` (symbols,
    a separator, then the symbols copied or sorted: only the answer is scored), `parity` (bits; each position's
    target is the parity of the bits so far) or `charlm` (windows of the standard library's sources: the first 90%
    to train on, the last 10% `held` out)."""
    if task == "charlm":
        corpus = text()
        cut = int(0.9 * len(corpus))
        corpus = corpus[cut:] if held else corpus[:cut]
        start = torch.randint(0, len(corpus) - length - 1, (batch,), generator=gen)
        window = torch.stack([corpus[s : s + length + 1] for s in start.tolist()])
        return window[:, :-1], window[:, 1:], torch.ones(batch, length, dtype=torch.bool)
    if task == "parity":
        bits = torch.randint(0, 2, (batch, length), generator=gen)
        return bits, bits.cumsum(1) % 2, torch.ones(batch, length, dtype=torch.bool)
    symbols = torch.randint(2, 12, (batch, length), generator=gen)
    answer = symbols.sort(1).values if task == "sort" else symbols
    seq = torch.cat([symbols, torch.full((batch, 1), SEP), answer], 1)
    mask = torch.zeros(batch, 2 * length, dtype=torch.bool)
    mask[:, length:] = True  # from the separator on, the next token is the answer's
    return seq[:, :-1], seq[:, 1:], mask
