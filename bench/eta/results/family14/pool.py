"""Pool the two halves of the fourteen-family leave-one-family-out run by case, as the report's `all` does.

python bench/eta/results/family14/pool.py OLD.json HALF_A.json HALF_B.json
"""

import json
import sys
from pathlib import Path

CUTS = ("10%", "20%", "30%", "50%", "80%")
NEW = ("conv-adamw-cosine", "logreg-separable", "lstsq-spectrum")


def families(paths: list[str], method: str = "prior_and_fit_blend") -> dict:
    out: dict = {}
    for path in paths:
        rows = json.loads(Path(path).read_text())["methods"][method]["loss"]
        out.update({k: v for k, v in rows.items() if k != "all"})
    return out


def pool(rows: dict, names: list[str]) -> dict:
    """Per cut: within ±20% and coverage pooled by case (%), family cells inside 75-85%, cases."""
    out = {}
    for cut in CUTS:
        got = [rows[f][cut] for f in names if f in rows]
        total, scored = sum(g["n_total"] for g in got), sum(g["n"] for g in got)
        within = sum(g["within_20pct"] * g["n_total"] for g in got) / total
        coverage = sum(g["coverage_10_90"] * g["n"] for g in got) / scored
        inside = sum(75 <= g["coverage_10_90"] * 100 <= 85 for g in got)
        out[cut] = (round(100 * within, 1), round(100 * coverage, 1), inside, total)
    return out


def main() -> None:
    old, new = families(sys.argv[1:2]), families(sys.argv[2:])
    former = sorted(old)
    print("before, its families:", pool(old, former))
    print("after, the same families:", pool(new, former))
    print("after, the new families:", pool(new, list(NEW)))
    print("after, all:", pool(new, sorted(new)))


if __name__ == "__main__":
    main()
