#!/bin/bash
# Issue #33 round 9 on the matrix from the snapshot of the commit under test (SRC): sigma 0, trainmaster (burst from
# round 8's runs re-keyed: it reads nothing that changed, checked on one cell at the end), the tuned-on cells the
# change can move first (gpuspec10), then the held-out gpuspec cells, then every other cell; then sigma 0.3 as time
# allows. 2 workers at nice 10; resumable (finished runs are kept in OUT). Usage: SRC=... stages.sh OUT BURST LOG
out=$(realpath "$1"); burst=$(realpath "$2"); log=$(realpath "$3")
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
REST="cpu0 cpu050 cpu100 cpu250 cpu300 default gpushare100 gpushare20 gpushare40 gpushare80"
stage() {
  name=$1; shift
  echo "STAGE $name $(date -u +%T)" >> "$log"
  timeout 3600 nice -n 10 .venv/bin/python bench/sched/matrix.py --workers 2 \
    --policies trainmaster burst --cache "$out" --read-cache "$burst" "$@" >> "${log%.log}.out" 2>&1
  echo "END $name rc=$? $(date -u +%T)" >> "$log"
}
stage s0-tuned-gpuspec10 --sigmas 0 --variants gpuspec10 --sizes 16+8 8+4
stage s0-held-gpuspec --sigmas 0 --variants gpuspec05 gpuspec20 gpuspec25 gpuspec10 --sizes 22+12 16+8 12+6 8+4
stage s0-rest-small --sigmas 0 --variants $REST --sizes 22+12 16+8
stage s0-rest-126 --sigmas 0 --variants $REST --sizes 12+6
stage s0-rest-84 --sigmas 0 --variants $REST --sizes 8+4
echo "ALLDONE $(date -u +%T)" >> "$log"
