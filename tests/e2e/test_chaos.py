"""Chaos: 200 short checkpointing jobs while every service, one agent and the NATS server are SIGKILLed and
restarted at random moments. Every job ends exactly once, no two attempts of a job ever run at the same time,
and the usage ledger holds exactly one line per attempt that ran."""

import asyncio
import json
import random
import signal
import time

import pytest

from services.stack.processes import SERVICES
from tests.conftest import wait_until_ready
from tests.e2e.outcomes import (
    all_finished,
    assert_attempts_never_overlapped,
    ledger_settles,
    post_until_accepted,
    supervised_after,
)
from tests.e2e.scripts import quote
from tests.factories import job_body, unique

pytestmark = pytest.mark.e2e
JOBS = 200
# Six ticks, each appended to the marker with its job, attempt and time, then checkpointed; a later attempt goes on
# from the step after its checkpoint. In sh, not Python: a Python start is ~0.09 s of CPU, ~20 s of the suite's two
# cores over the ~250 jobs of this test and the fail-over test, for nothing they check.
TICKING = r"""
marker=$1 ckpt="$TRAINMASTER_CHECKPOINT_DIR/step" step=0
[ -f "$ckpt" ] && step=$(( $(cat "$ckpt") + 1 ))
while [ "$step" -lt 6 ]; do
    echo "$TRAINMASTER_JOB_ID $TRAINMASTER_ATTEMPT $(date +%s.%3N)" >> "$marker"
    sleep 0.1
    echo "$step" > "$ckpt.tmp" && mv -f "$ckpt.tmp" "$ckpt"
    step=$((step + 1))
done
"""


def ticking(marker) -> str:
    """The command of a ticking job writing to `marker`."""
    return f"sh -c {quote(TICKING)} ticking {marker}"


async def test_chaos(api, project, stack, shared_dir):
    marker = shared_dir / "ticks"
    marker.touch()
    marker.chmod(0o666)  # appended to by every job, each its own user
    url = f"/v2/{project}/training-jobs"
    rng = random.Random(20261122)
    victims = list(SERVICES) + ["agent-local-1", "nats"]  # local-1 is where most jobs go
    kills: list[str] = []
    started = time.monotonic()

    async def submit_all() -> None:
        for _ in range(JOBS):
            body = job_body(name=unique("c"), command=ticking(marker), cpu_count=0.5, memory_gb=0.5)
            await post_until_accepted(api, url, body)

    async def chaos() -> None:
        for victim in rng.sample(victims, len(victims)):
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            stack.signal(victim, signal.SIGKILL)
            kills.append(victim)
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            if victim == "nats":
                stack.start_nats()
            elif victim.startswith("agent-"):
                stack.start_agent(victim.removeprefix("agent-"))
            else:
                stack.start_service(victim)

    async with supervised_after(stack, chaos()) as faults:
        await submit_all()
        await faults
        items = await all_finished(api, project, jobs=JOBS, context=f"kills {kills}")
        assert {j["status"]["phase"] for j in items} == {"Completed"}
        assert_attempts_never_overlapped(marker, items)
        recovered = sum(1 for j in items if len(j["status"]["attempts"]) > 1)
        ran = await ledger_settles(api, project)
    wait_until_ready(stack)
    print(
        "\nCHAOS "
        + json.dumps(
            {
                "jobs": JOBS,
                "kills": kills,
                "jobs_recovered": recovered,
                "attempts_run": ran,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )
