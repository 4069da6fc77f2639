#!/bin/bash
# issue #33 round 7: trainmaster only (or POLICY), sigma 0, one simulation at a time, from a snapshot of a commit
# (git archive into SRC, with ../shared/data and .venv beside it) so edits in the worktree never reach a running cell.
# usage: SRC=dir run.sh OUT.jsonl "variant size" ...
out=$(realpath "$1"); shift
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
for cell in "$@"; do
  set -- $cell
  echo "START $1 $2 $(date -u +%T)"
  timeout 1500 nice -n 10 .venv/bin/python bench/sched/matrix.py --data ../shared/data/alibaba-gpu-v2023 --workers 1 \
    --variants "$1" --sizes "$2" --sigmas 0 --policies "${POLICY:-trainmaster}" --cache "$out"
  echo "END $1 $2 rc=$? $(date -u +%T)"
done
