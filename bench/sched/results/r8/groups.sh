#!/bin/bash
# Round 8's misses by group (bench/sched/groups.py: wait to the first start), from the snapshot of the commit under
# test (SRC), trainmaster at sigma 0. Usage: SRC=... groups.sh VARIANT LOCAL RESERVED
out=$(cd "$(dirname "$0")" && pwd)
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
d=../shared/data/alibaba-gpu-v2023
nice -n 10 timeout 900 .venv/bin/python bench/sched/groups.py --pods $d/openb_pod_list_$1.csv \
  --nodes $d/openb_node_list_gpu_node.csv --local $2 --reserved $3 > "$out/groups-$1-$2-$3-trainmaster.txt" 2>&1
