#!/bin/bash
# Round 8's spot column (sigma 0), from the snapshot of the commit under test (SRC), cheap sizes first; 1 worker at
# nice 10, alongside the sigma 0.3 stages; resumable. Usage: SRC=... spot.sh
here=$(cd "$(dirname "$0")" && pwd)
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
for size in 22+12 16+8 12+6 8+4; do
  echo "STAGE spot $size $(date -u +%T)" >> "$here/spot.log"
  nice -n 10 timeout 3600 .venv/bin/python bench/sched/matrix.py --workers 1 --sigmas 0 --sizes $size \
    --policies trainmaster+spot --cache "$here/spot-r8.jsonl" --read-cache "$here/runs-r8.jsonl" \
    "$here/burst-rekeyed.jsonl" >> "$here/spot.out" 2>&1
  echo "END spot $size rc=$? $(date -u +%T)" >> "$here/spot.log"
done
