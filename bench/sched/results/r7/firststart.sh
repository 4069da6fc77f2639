#!/bin/bash
# per-job first starts of one cell under round 6 after the review (b705304) and round 7 (bfe089b), one after the other
R=$(dirname "$(realpath "$0")"); ROOT=$(realpath "$R/../../../..")
for c in bfe089b b705304; do
  (cd "$ROOT/.snap/$c" && PYTHONPATH=$PWD OMP_NUM_THREADS=1 timeout 1500 nice -n 10 .venv/bin/python "$R/firststart.py" \
    "$1" "$2" "$3" "$R/jobs-$1-$2-$3-$c.jsonl")
done
