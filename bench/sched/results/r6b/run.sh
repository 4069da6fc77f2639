#!/bin/bash
# round 6 after the review: the tuning cell and the three sigma-0 misses, trainmaster only, one at a time
cd "$(dirname "$0")/../../../.." && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
for cell in "gpuspec10 8+4" "cpu0 12+6" "gpuspec20 12+6" "gpuspec20 8+4"; do
  set -- $cell
  timeout 1500 nice -n 10 .venv/bin/python bench/sched/matrix.py --data ../shared/data/alibaba-gpu-v2023 --workers 1 \
    --variants "$1" --sizes "$2" --sigmas 0 --policies trainmaster --cache bench/sched/results/r6b/after-review.jsonl
done
