"""Round 12 against round 9's policy (shipped; round 10's setting off), trainmaster at sigma 0: per cell and per split,
the cells run this round only (the queue order moves any cell with local-only jobs queued: none is counted unrun).
Round 9's figure of a cell is as round 10 took it (`r10/compare.py`): round 9's policy run in round 10
(`r10/check-off.jsonl`), else round 9's run (`r9/runs-r9*.jsonl`), else round 8's (`r8/runs-r8.jsonl`). Burst is
round 10's runs re-keyed to this round's code (`burst-rekeyed.jsonl`, from `r11/burst-rekeyed.jsonl` by `r7/rekey.py`).
Usage: PYTHONPATH=. python bench/sched/results/r12/compare.py"""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from common import load, print_tables, split_of  # noqa: E402

MISSES = {("cpu0", "12+6"), ("gpuspec05", "22+12"), ("gpuspec10", "22+12")}  # round 9's policy's three misses
LIMIT = 1.05


def main() -> None:
    burst = load([HERE / "burst-rekeyed.jsonl"], "burst", 0.0)
    before = load(
        [
            HERE.parent / "r8" / "runs-r8.jsonl",
            HERE.parent / "r9" / "runs-r9.jsonl",
            HERE.parent / "r9" / "runs-r9-miss.jsonl",
            HERE.parent / "r10" / "check-off.jsonl",
        ],
        "trainmaster",
        0.0,
    )
    after = load(sorted(HERE.glob("runs-r12*.jsonl")), "trainmaster", 0.0)
    rows = [(split_of(c, MISSES), c, burst[c], before.get(c), after[c]) for c in sorted(after)]
    print_tables(rows=rows, names=("round 9", "round 12"), marks={}, limit=LIMIT)


if __name__ == "__main__":
    main()
