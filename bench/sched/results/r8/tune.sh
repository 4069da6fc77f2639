#!/bin/bash
# Round 8 tuning: the cost-sensitive weight on the tuning variants at the matrix's tuned-on sizes (8+4, 16+8) and two
# sizes outside the matrix (10+5, 14+7); trainmaster and burst, sigma 0. Usage: tune.sh WEIGHT... (resumable).
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for w in "$@"; do
  flag=(); [ "$w" != default ] && flag=(--cost-sensitive-weight "$w")
  nice -n 10 timeout 3000 .venv/bin/python bench/sched/matrix.py --quick --sizes 8+4 10+5 14+7 16+8 \
    --policies trainmaster burst --workers 2 --cache bench/sched/results/r8/tuning.jsonl "${flag[@]}" \
    > "bench/sched/results/r8/tune-$w.out" 2>&1
done
