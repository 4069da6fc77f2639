#!/bin/bash
# Issue #33 round 13 on the matrix from a snapshot of the code under test (SRC): sigma 0, trainmaster (burst from
# round 12's runs re-keyed, `r7/rekey.py`: burst reads nothing that changed), 1 worker at nice 15, resumable
# (finished runs are kept in OUT). Each stage is one `matrix.py` call; stages run in the order given.
# Usage: SRC=... stages.sh OUT BURST LOG STAGE... with STAGE = NAME:VARIANT,VARIANT:SIZE,SIZE
out=$(realpath "$1"); burst=$(realpath "$2"); log=$(realpath "$3"); shift 3
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
for stage in "$@"; do
  IFS=: read -r name variants sizes <<< "$stage"
  echo "STAGE $name $(date -u +%T)" >> "$log"
  timeout 3600 nice -n ${NICE:-15} .venv/bin/python bench/sched/matrix.py --workers 1 --sigmas 0 \
    --policies trainmaster burst --cache "$out" --read-cache "$burst" \
    --variants ${variants//,/ } --sizes ${sizes//,/ } >> "${log%.log}.out" 2>&1
  echo "END $name rc=$? $(date -u +%T)" >> "$log"
done
echo "ALLDONE $(date -u +%T)" >> "$log"
