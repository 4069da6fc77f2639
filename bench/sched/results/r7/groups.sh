#!/bin/bash
# round 7's sigma 0 misses by group (examined after the matrix ran them; nothing changed after), from the snapshot
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
out=$1; D=../shared/data/alibaba-gpu-v2023
for cell in "cpu0 12 6" "gpuspec20 8 4" "gpuspec20 12 6"; do
  set -- $cell
  timeout 1800 nice -n 10 .venv/bin/python bench/sched/groups.py --pods $D/openb_pod_list_$1.csv \
    --nodes $D/openb_node_list_gpu_node.csv --local $2 --reserved $3 > "$out/groups-$1-$2-$3-trainmaster.txt" 2>&1
done
