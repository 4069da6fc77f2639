#!/bin/bash
# issue #33 round 7 on the matrix, sigma 0, trainmaster only, from the snapshot of the commit under test (SRC):
# round 6's three misses, then every other held-out cell, cheap sizes first, then the tuned-on cells; 2 workers.
out=$(realpath "$1"); burst=$(realpath "$2"); log=$(realpath "$3")
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
ALL="cpu0 cpu050 cpu100 cpu250 cpu300 default gpushare100 gpushare20 gpushare40 gpushare80 gpuspec05 gpuspec10 gpuspec20 gpuspec25"
HELD="cpu0 cpu100 cpu250 cpu300 gpushare100 gpushare20 gpushare80 gpuspec05 gpuspec20 gpuspec25"
stage() {
  name=$1; shift
  echo "STAGE $name $(date -u +%T)" >> "$log"
  timeout 3600 nice -n 10 .venv/bin/python bench/sched/matrix.py --data ../shared/data/alibaba-gpu-v2023 --workers 2 \
    --sigmas 0 --policies trainmaster burst --cache "$out" --read-cache "$burst" "$@" >> "${log%.log}.out" 2>&1
  echo "END $name rc=$? $(date -u +%T)" >> "$log"
}
stage misses-126 --variants cpu0 gpuspec20 --sizes 12+6
stage miss-84 --variants gpuspec20 --sizes 8+4
stage held-2212 --variants $ALL --sizes 22+12
stage held-168 --variants $HELD --sizes 16+8
stage held-126 --variants $ALL --sizes 12+6
stage held-84 --variants $HELD --sizes 8+4
stage tuned --variants default gpushare40 gpuspec10 cpu050 --sizes 8+4 16+8
echo "ALLDONE $(date -u +%T)" >> "$log"
