"""Train the history model in a process of its own (so the estimator keeps answering), and save it.

python -m services.estimator.train --out DIR/history-v3.npz --corpus A.tar.gz B.tar.gz [--runs runs.json]
    [--threads 1]
"""

import argparse
import json
import os
from pathlib import Path

from services.estimator.model.calibrate import train_with_calibration
from services.estimator.model.corpus import Observation, Run, load_corpora


def runs_from_json(path: Path) -> list[Run]:
    """Completed trainmaster jobs, written by the estimator in the corpus' own shape (unknown keys ignored)."""
    fields = set(Run.__dataclass_fields__) - {"observations"}
    runs = []
    for item in json.loads(path.read_text()):
        observations = [Observation(**o) for o in item.get("observations", [])]
        runs.append(Run(**{k: v for k, v in item.items() if k in fields}, observations=observations))
    return runs


def learnable(runs: list[Run]) -> list[Run]:
    """Completed jobs that say how much work their target took (a job without a known target says nothing)."""
    return [r for r in runs if r.reached_target() and r.total_work is not None and r.duration_s > 0]


BACKGROUND_NICE = 10  # the services on this machine come first
# Every thread pool numpy and torch may open (OpenMP, MKL, OpenBLAS, numexpr, Accelerate): each reads its size once,
# when its library loads, by default one thread a core; numpy loads with this module, before any code could bound it.
THREAD_POOLS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def background_env(threads: int) -> dict[str, str]:
    """The environment the training process starts with: every thread pool bounded to `threads`."""
    return {name: str(threads) for name in THREAD_POOLS}


def background() -> None:
    """The training process's pre-exec step: lower priority, before it imports anything."""
    os.nice(BACKGROUND_NICE)


def settle(threads: int) -> None:
    """Background work, when run by hand too: lower priority (once), torch's own pools bounded."""
    if os.nice(0) < BACKGROUND_NICE:
        os.nice(BACKGROUND_NICE - os.nice(0))
    from services.estimator.model.historynet import limit_threads  # torch: this process only

    limit_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--corpus", nargs="*", default=[])
    parser.add_argument("--runs", type=Path)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads torch may use")
    args = parser.parse_args()
    settle(max(1, args.threads))
    runs = load_corpora(args.corpus) + (learnable(runs_from_json(args.runs)) if args.runs else [])
    if not runs:
        raise SystemExit("no training runs")
    model = train_with_calibration(runs)
    tmp = args.out.with_suffix(".tmp")
    model.save(tmp)
    tmp.replace(args.out)
    print(f"trained on {len(runs)} runs: {args.out}")


if __name__ == "__main__":
    main()
