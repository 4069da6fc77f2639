#!/usr/bin/env bash
# The one script a session with a GPU machine runs, from the repository root: `bash bench/gpu/run.sh`.
# The machine has Python 3 with torch (CUDA) and no venv: the project's other dependencies come from wheels
# carried in .whl/ (cp312, manylinux; see docs/operations.md "Real GPUs" for how to make them), installed into
# /tmp/site. It prints the GPUs, measures their throughput as the agent does, then runs the GPU tier (tests/gpu)
# and the unit tests of what the tier relies on. Results (logs, gpu-report.json) go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/.trainmaster/gpu-run}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
SITE="${SITE:-/tmp/site}"
TIER_TIMEOUT_S="${TIER_TIMEOUT_S:-480}"

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/*.whl 2>&1 | tail -5
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"  # nats-server comes with its wheel
export OUT

{
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
    "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
          torch.cuda.is_available(), torch.cuda.device_count())" 2>&1
    "$PY" -c "import pynvml" 2>&1 && echo "pynvml: importable" || echo "pynvml: MISSING (the agent cannot see GPUs)"
    command -v nats-server || echo "nats-server: MISSING"
} | tee "$OUT/machine.txt"

echo "== throughput (services/agent/gpubench.py, as the agent runs it at start)"
timeout 120 "$PY" services/agent/gpubench.py | tee "$OUT/gpubench.json"

echo "== unit tests the tier relies on"
timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_gpu_throughput.py tests/unit/test_gpu_speed.py \
    2>&1 | tail -5 | tee "$OUT/unit.txt"

echo "== the GPU tier (tests/gpu)"
timeout "$TIER_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider -rs -s --durations=10 \
    --basetemp /tmp/gpu-tier tests/gpu >"$OUT/tier.log" 2>&1
status=$?
tail -60 "$OUT/tier.log"
# the stack's own logs, for whatever failed
mkdir -p "$OUT/stack-logs" && cp /tmp/gpu-tier/gpu-stack*/logs/*.log "$OUT/stack-logs/" 2>/dev/null
echo "== tier exit status: $status (124: past ${TIER_TIMEOUT_S}s)"
exit "$status"
