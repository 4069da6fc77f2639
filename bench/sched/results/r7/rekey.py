"""Re-key round 6's burst runs to the code checked out: burst reads none of what round 7 changed (`pick`, the
contention charge, make room), so its runs stand (round 6 checked one on `cpu0` 12+6 to the cent).
Usage: PYTHONPATH=. python bench/sched/results/r7/rekey.py IN.jsonl OUT.jsonl"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import matrix  # noqa: E402


def main(src: str, dst: str) -> None:
    code = matrix.code_version()
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            key, result = json.loads(line)
            if key.startswith("burst|"):
                out.write(json.dumps([f"{key.rsplit('|', 1)[0]}|{code}", result]) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
