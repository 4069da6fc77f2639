#!/bin/bash
# Round 9, item 1: where the on-demand dollars go on the tuning cells (bench/sched/groups.py --dollars --json), trainmaster
# and burst at sigma 0, from the snapshot of the commit under test (SRC).
# Usage: SRC=... [SIZES='8x4 16x8'] [VARIANTS='default ...'] dollars.sh [TAG]
out=$(cd "$(dirname "$0")" && pwd); tag=${1:-r8}
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
d=/work/shared/data/alibaba-gpu-v2023
for size in ${SIZES:-8x4 16x8}; do set -- ${size/x/ }
  for v in ${VARIANTS:-default gpushare40 gpuspec10 cpu050}; do
    for policy in trainmaster burst; do
      f="$out/dollars-$tag-$policy-$v-$1-$2.json"; [ -s "$f" ] && continue
      echo "$(date -u +%T) $policy $v $1+$2"
      nice -n 10 timeout 1800 .venv/bin/python bench/sched/groups.py --pods $d/openb_pod_list_$v.csv \
        --nodes $d/openb_node_list_gpu_node.csv --local $1 --reserved $2 --policy $policy --dollars --json > "$f.tmp" \
        && mv "$f.tmp" "$f"
    done
  done
done
