"""Round 10 against round 9, trainmaster at sigma 0: per cell and per split. Round 9's figure of a cell is round 9's
policy run this round (`check-off.jsonl`: the default, off, at `7cd17e5`, `gpuspec10` 16+8 equal to round 9's
run to the cent, and 22+12), else its run (`r9/runs-r9*.jsonl`), else round 8's (`r8/runs-r8.jsonl`: the variants
round 9 counted at round 8's result, and the gpuspec cells it did not run). Round 10 changed only what owned-only jobs
that may use several owned kinds or GPU models see: the ten variants without a job no instance type could host
(`UNCHANGED`) have none and decide alike by construction, so a cell of theirs this round did not run counts round 9's
figure, marked `=`.
Usage: PYTHONPATH=. python bench/sched/results/r10/compare.py"""

import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from common import load, print_tables, split_of  # noqa: E402

MISSES = {("cpu0", "12+6"), ("gpuspec05", "22+12")}  # round 9's two misses
UNCHANGED = {"cpu0", "cpu050", "cpu100", "cpu250", "cpu300", "default", "gpushare100", "gpushare20", "gpushare40"}
UNCHANGED |= {"gpushare80"}
LIMIT = 1.05


def main() -> None:
    burst = load([HERE.parent / "r9" / "burst-rekeyed.jsonl"], "burst", 0.0)
    before = load(
        [
            HERE.parent / "r8" / "runs-r8.jsonl",
            HERE.parent / "r9" / "runs-r9.jsonl",
            HERE.parent / "r9" / "runs-r9-miss.jsonl",
            HERE / "check-off.jsonl",
        ],
        "trainmaster",
        0.0,
    )
    after = load(sorted(HERE.glob("runs-r10*.jsonl")), "trainmaster", 0.0)
    filled = {c for c in before if c not in after and c[0] in UNCHANGED}
    after |= {c: before[c] for c in filled}
    rows = [(split_of(c, MISSES), c, burst[c], before.get(c), after[c]) for c in sorted(after)]
    print_tables(rows=rows, names=("round 9", "round 10"), marks=dict.fromkeys(filled, "= "), limit=LIMIT)
    print()
    print(f"{len(filled)} cells counted at round 9's result (`=`), {len(after) - len(filled)} run this round")


if __name__ == "__main__":
    main()
