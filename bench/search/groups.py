"""Searches to replay: chunks of the recorded digits sweep (bench/search/data) and groups of MLPerf runs of one
benchmark and round that differ in hyperparameters (../shared/data/mlperf, parsed by the estimator's loader)."""

import gzip
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench.search.replay import Curve
from services.submitter.searches.pruners import Point

SWEEP = Path(__file__).parent / "data" / "sweep.jsonl.gz"
TRIALS = 16  # trials per replayed search
MIN_POINTS = 4


@dataclass(frozen=True)
class Group:
    name: str
    source: str  # "sweep" or "mlperf"
    split: str  # "tune" or "test"
    curves: tuple[Curve, ...]


def sweep_groups(path: Path = SWEEP, *, metric: str = "val_loss", size: int = TRIALS) -> list[Group]:
    """The sweep's runs per group (model family), in recording order, cut into searches of `size` trials;
    alternate searches are for tuning and for the held-out test."""
    if not path.exists():
        return []
    by_group: dict[str, list[Curve]] = defaultdict(list)
    for row in _rows(path):
        points = tuple(
            Point(p["t"], p.get("step", i + 1), p[metric])
            for i, p in enumerate(row["points"])
            if isinstance(p.get(metric), int | float)
        )
        if len(points) >= MIN_POINTS:
            by_group[row["group"]].append(Curve(run=row["run"], points=points))
    out = []
    for name, curves in sorted(by_group.items()):
        for i in range(len(curves) // size):
            out.append(
                Group(
                    f"sweep/{name}/{i}",
                    "sweep",
                    "tune" if i % 2 == 0 else "test",
                    tuple(curves[i * size : (i + 1) * size]),
                )
            )
    return out


def _rows(path: Path) -> list[dict]:
    """Every complete line of the sweep (one being appended may end in half a gzip member: it is left out)."""
    rows = []
    try:
        with gzip.open(path, "rt") as fh:
            for line in fh:
                rows.append(json.loads(line))
    except (EOFError, OSError, json.JSONDecodeError):
        pass
    return rows


def mlperf_groups(
    tarballs: list[Path], *, cache_dir: Path | None = None, size: int = TRIALS, seed: int = 0
) -> list[Group]:
    """Per round and benchmark, up to `size` runs spread over its distinct (batch size, learning rate) settings,
    each cut at the group's common progress (all trials get the same budget), eval metric oriented to lower-better.
    The first tarball (older round) is for tuning, the others are the held-out test."""
    from services.estimator.model.corpus import load_cached

    out = []
    for index, tarball in enumerate(tarballs):
        runs = [
            r
            for r in load_cached(tarball, cache_dir=cache_dir)
            if r.duration_s > 30 and len([o for o in r.evals if o.progress is not None]) >= MIN_POINTS
        ]
        by_bench: dict[str, list] = defaultdict(list)
        for run in runs:
            by_bench[run.benchmark].append(run)
        for bench, members in sorted(by_bench.items()):
            group = _mlperf_group(members, size=size, seed=seed)
            if group:
                out.append(
                    Group(
                        f"mlperf/{members[0].version}/{bench}", "mlperf", "tune" if index == 0 else "test", tuple(group)
                    )
                )
    return out


def _mlperf_group(runs: list, *, size: int, seed: int) -> list[Curve]:
    settings: dict[tuple, list] = defaultdict(list)
    for run in sorted(runs, key=lambda r: r.run_id):
        settings[(run.batch_size, run.learning_rate)].append(run)
    if len(settings) < 3:
        return []
    rng = random.Random(seed)
    pools = [rng.sample(v, len(v)) for _, v in sorted(settings.items())]
    chosen = []
    while len(chosen) < size and any(pools):
        for pool in pools:
            if pool and len(chosen) < size:
                chosen.append(pool.pop())
    sign = {"max": -1.0, "min": 1.0}
    ends = [max(o.progress for o in r.evals if o.progress is not None) for r in chosen]
    common = min(ends)
    curves = []
    for run in chosen:
        points = tuple(
            Point(o.t_s, o.progress, sign[run.mode] * o.value)
            for o in run.evals
            if o.progress is not None and o.progress <= common * (1 + 1e-9)
        )
        if len(points) >= MIN_POINTS:
            curves.append(Curve(run=run.run_id, points=points, gpus=float(run.accelerators)))
    return curves if len(curves) >= 6 else []
