#!/bin/bash
# Round 8 tuning from a snapshot of a commit (the work tree changes while it runs): SHA WEIGHT-OR-KNOB-ARGS...
# Usage: tune-snap.sh SHA LABEL [matrix args...]; appends to results/r8/tuning.jsonl (keyed by the snapshot's digest).
set -e
tree=$(cd "$(dirname "$0")/../../../.." && pwd); sha=$1; label=$2; shift 2
snap=$tree/.trainmaster/snap-$sha
if [ ! -d "$snap" ]; then
  mkdir -p "$snap" && git -C "$tree" archive "$sha" | tar -x -C "$snap" && ln -s /work/main/.venv "$snap/.venv"
fi
ln -sfn /work/shared "$tree/.trainmaster/shared"  # the matrix's default data folder is ../shared/data/...
cd "$snap" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
nice -n 10 timeout 3000 .venv/bin/python bench/sched/matrix.py --quick --sizes 8+4 10+5 14+7 16+8 \
  --policies trainmaster burst --workers 2 --cache "$tree/bench/sched/results/r8/tuning.jsonl" "$@" \
  > "$tree/bench/sched/results/r8/tune-$label.out" 2>&1
