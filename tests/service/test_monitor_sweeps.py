"""The monitor's sweeps for due and hung jobs (a query each, every second, that the embedded database answers by
reading every job) read only when a job this process wrote, or one its last sweep read, can be found, and once a
minute for what another process wrote."""

from datetime import UTC, datetime, timedelta

from shared.bus import publish
from services.monitor.dues import LOOK_ANYWAY, Dues
from services.monitor.hangs import restart_overdue
from tests.factories import exited, placed, started, submitted
from tests.service.test_monitor_fence_reads import CountingReads
from tests.unit.test_monitor_hangs import hung


async def sweep(monitor, now: datetime) -> None:
    await monitor.expire_due(now)
    await restart_overdue(monitor, grace_s=60, now=now)


async def test_at_rest_and_through_a_job_without_a_limit_the_sweeps_read_nothing_after_the_first(monitor_broker):
    broker, monitor, _ = monitor_broker
    jobs = monitor.jobs.collection = CountingReads()
    now = datetime.now(UTC)
    await sweep(monitor, now)  # at start: what an earlier process stored is not known
    first = jobs.reads
    for event in (submitted(job_id="j"), placed("j"), started("j"), exited("j")):
        await publish(broker, event)
        reads = jobs.reads
        await sweep(monitor, now := now + timedelta(seconds=1))
        assert jobs.reads == reads  # two reads a second before
    assert first >= 2


async def test_a_job_past_its_deadline_and_a_hung_job_are_still_swept(monitor_broker):
    broker, monitor, seen = monitor_broker
    now = datetime.now(UTC)
    await sweep(monitor, now)
    for event in (submitted(job_id="j", max_duration_s=1), placed("j"), started("j")):
        await publish(broker, event)
    await sweep(monitor, now + timedelta(seconds=5))
    assert (await monitor.jobs.load("j"))["phase"] == "Terminating"

    for event in (submitted(job_id="h"), placed("h"), started("h"), hung("h")):
        await publish(broker, event)
    assert (await monitor.jobs.load("h"))["secondary_phase"] == "Hanging"
    await sweep(monitor, datetime.now(UTC) + timedelta(seconds=120))  # its grace is over
    assert (await monitor.jobs.load("h"))["stop_cause"] == "hung"  # snapshotted, to be restarted


async def test_a_job_written_by_another_process_after_the_first_sweep_is_swept_within_a_minute(monitor_broker):
    """A deposed leader's last write can land after this leader's first sweep read: the sweeps read once a minute
    whatever this process knows (`dues.LOOK_ANYWAY`)."""
    broker, monitor, _ = monitor_broker
    now = datetime.now(UTC)
    for event in (submitted(job_id="late", max_duration_s=1), placed("late"), started("late")):
        await publish(broker, event)
    monitor.dues = Dues()  # a leader that did not write it: its first sweeps read before the write landed
    monitor.dues.due_sweep_begins(now)
    monitor.dues.due_swept(None)
    monitor.dues.hang_sweep_begins(now)
    monitor.dues.hang_swept(False)
    await sweep(monitor, now + timedelta(seconds=30))
    assert (await monitor.jobs.load("late"))["phase"] == "Running"  # nothing read: the write passed it by
    await sweep(monitor, now + LOOK_ANYWAY)
    assert (await monitor.jobs.load("late"))["phase"] == "Terminating"
