"""Parts of an offline build made in forked processes (the own-job folds, their samples, a calibration's networks):
each part a seeded, deterministic function of what the parent holds, so a build gives the same parts whatever the
number of processes."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

K = TypeVar("K")
T = TypeVar("T")
_MAKE: list[Callable[[Any], Any]] = []  # what the processes run: inherited by the fork, never pickled
_WORKER: list[bool] = []  # set in a forked process: its parts are made in it, not forked again


def in_processes(make: Callable[[K], T], keys: Sequence[K], *, jobs: int = 1) -> list[T]:
    """`make` of every key, in order: in this process when `jobs` is 1 or less (or in a forked one already), else
    in up to `jobs` forked ones, which inherit `make` and its data (only the keys and the parts are pickled). A
    part that raises, or a process that dies, fails the whole (never a hang, never a part left out). Torch, when
    loaded, is set to one thread first: a process forked from a multi-threaded torch hangs in its first op."""
    if jobs <= 1 or len(keys) <= 1 or _WORKER:
        return [make(key) for key in keys]
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(1)
    _MAKE[:] = [make]
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            min(jobs, len(keys)), mp_context=context, initializer=_WORKER.append, initargs=(True,)
        ) as pool:
            return list(pool.map(_made, keys))
    finally:
        _MAKE.clear()


def _made(key: Any) -> Any:
    return _MAKE[0](key)
