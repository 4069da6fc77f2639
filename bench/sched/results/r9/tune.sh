#!/bin/bash
# Round 9: trainmaster on tuning cells from a snapshot of the work tree under test (SRC), sigma 0, 1 worker, niced.
# Usage: SRC=... tune.sh OUT.jsonl VARIANT... (sizes 8+4 and 16+8, the tuned-on sizes)
out=$(cd "$(dirname "$0")" && pwd); file=$1; shift
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
nice -n 10 .venv/bin/python bench/sched/matrix.py --data /work/shared/data/alibaba-gpu-v2023 --variants "$@" \
  --sizes 16+8 8+4 --sigmas 0 --policies trainmaster --workers 1 --cache "$out/$file"
