#!/bin/bash
# Issue #33 round 8 on the matrix from the snapshot of the commit under test (SRC): sigma 0, every cell, trainmaster
# (burst from round 7's runs, re-keyed: it reads nothing that changed), cheap sizes first; then sigma 0.3 on the
# held-out cells, cheap sizes first. 2 workers at nice 10; resumable (finished runs are kept in OUT).
# Usage: SRC=... stages.sh OUT.jsonl BURST.jsonl LOG
out=$(realpath "$1"); burst=$(realpath "$2"); log=$(realpath "$3")
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
ALL="cpu0 cpu050 cpu100 cpu250 cpu300 default gpushare100 gpushare20 gpushare40 gpushare80 gpuspec05 gpuspec10 gpuspec20 gpuspec25"
HELD="cpu0 cpu100 cpu250 cpu300 gpushare100 gpushare20 gpushare80 gpuspec05 gpuspec20 gpuspec25"
stage() {
  name=$1; shift
  echo "STAGE $name $(date -u +%T)" >> "$log"
  timeout 3600 nice -n 10 .venv/bin/python bench/sched/matrix.py --workers 2 \
    --policies trainmaster burst --cache "$out" --read-cache "$burst" "$@" >> "${log%.log}.out" 2>&1
  echo "END $name rc=$? $(date -u +%T)" >> "$log"
}
stage s0-2212 --sigmas 0 --variants $ALL --sizes 22+12
stage s0-168 --sigmas 0 --variants $ALL --sizes 16+8
stage s0-126 --sigmas 0 --variants $ALL --sizes 12+6
stage s0-84 --sigmas 0 --variants $ALL --sizes 8+4
stage s03-2212 --sigmas 0.3 --variants $ALL --sizes 22+12
stage s03-168 --sigmas 0.3 --variants $HELD --sizes 16+8
stage s03-126 --sigmas 0.3 --variants $ALL --sizes 12+6
stage s03-84 --sigmas 0.3 --variants $HELD --sizes 8+4
echo "ALLDONE $(date -u +%T)" >> "$log"
# run after the above, as time allowed: the tuned-on cells at sigma 0.3
# stage s03-tuned --sigmas 0.3 --variants default gpushare40 gpuspec10 cpu050 --sizes 8+4 16+8
