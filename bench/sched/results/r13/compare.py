"""Round 13 (the setting on: the contention charge and make room plan the local-only queue in the order it is served)
against round 12's runs of the setting (`r12/runs-r12-*.jsonl`), then against round 9's policy (shipped, setting off,
as round 10 took it: `r10/compare.py`), trainmaster at sigma 0, the cells run this round only. Burst is round 12's
runs re-keyed to this round's code (`burst-rekeyed.jsonl`, by `r7/rekey.py`: burst reads nothing that changed).
Usage: PYTHONPATH=. python bench/sched/results/r13/compare.py"""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from common import load, print_tables, split_of  # noqa: E402

MISSES = {("cpu0", "12+6"), ("gpuspec05", "22+12"), ("gpuspec10", "22+12")}  # round 9's policy's three misses
LIMIT = 1.05


def main() -> None:
    burst = load([HERE / "burst-rekeyed.jsonl"], "burst", 0.0)
    round12 = load(sorted((HERE.parent / "r12").glob("runs-r12*.jsonl")), "trainmaster", 0.0)
    round9 = load(
        [
            HERE.parent / "r8" / "runs-r8.jsonl",
            HERE.parent / "r9" / "runs-r9.jsonl",
            HERE.parent / "r9" / "runs-r9-miss.jsonl",
            HERE.parent / "r10" / "check-off.jsonl",
        ],
        "trainmaster",
        0.0,
    )
    after = load(sorted(HERE.glob("runs-r13*.jsonl")), "trainmaster", 0.0)
    for name, before in (("round 12", round12), ("round 9", round9)):
        rows = [(split_of(c, MISSES), c, burst[c], before.get(c), after[c]) for c in sorted(after)]
        print_tables(rows=rows, names=(name, "round 13"), marks={}, limit=LIMIT)
        print()


if __name__ == "__main__":
    main()
