#!/bin/bash
# Round 8 tuning grid at 6c6ffa4, one setting after another (resumable: finished runs are kept in tuning.jsonl).
d=$(dirname "$0")
while kill -0 16205 2>/dev/null; do sleep 10; done  # the default weight's run (at 47bb673) first
$d/tune-snap.sh 6c6ffa4 w1.0 --cost-sensitive-weight 1.0
$d/tune-snap.sh 6c6ffa4 b1.0 --cost-sensitive-backlog-weight 1.0
