#!/bin/bash
# Round 11: the exchange rate's part of the dollars (round 9's "Next"): two tuning cells at 8+4 (`default`,
# `gpushare40`) at --exchange-rate RATE (2.0 is the tuning stage's), trainmaster and burst (keyed apart by the rate),
# sigma 0, 1 worker at nice 10, from a snapshot of the code under test (SRC). Usage: SRC=... rate.sh OUT LOG RATE
out=$(realpath "$1"); log=$(realpath "$2"); rate=$3
cd "${SRC:?}" && export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1
echo "RATE $rate $(date -u +%T)" >> "$log"
timeout 3600 nice -n 10 .venv/bin/python bench/sched/matrix.py --workers 1 --sigmas 0 \
  --policies trainmaster burst --cache "$out" --exchange-rate "$rate" \
  --variants default gpushare40 --sizes 8+4 >> "${log%.log}.out" 2>&1
echo "END rc=$? $(date -u +%T)" >> "$log"
