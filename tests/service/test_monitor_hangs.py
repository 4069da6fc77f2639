"""The monitor's hang handling under TestNatsBroker: a report from the placed node suspects the job, the grace
check restarts it from its checkpoint; reports from elsewhere change nothing."""

from datetime import UTC, datetime, timedelta

import pytest

from shared.bus import publish, stream_of
from services.monitor.hangs import restart_overdue
from tests.factories import exited, placed, started, submitted
from tests.service.conftest import monitor_on_bus
from tests.unit.test_monitor_hangs import hung, resumed

WATCHED = ("tm.job.status.*.*", "tm.notify.p", "tm.node.cmd.n1.stop")


@pytest.fixture
async def hang_broker():
    """The monitor on a test broker with job j running on n1, and what it publishes on the watched subjects."""
    async with monitor_on_bus(WATCHED) as (test_broker, monitor, seen):
        for event in [submitted(job_id="j"), placed("j", nodes=("n1",)), started("j", node_id="n1")]:
            await publish(test_broker, event)
        yield test_broker, monitor, seen


async def test_a_hung_job_is_flagged_then_restarted_from_its_checkpoint(hang_broker):
    broker, monitor, seen = hang_broker
    await publish(broker, hung("j"))
    doc = await monitor.jobs.load("j")
    assert (doc["phase"], doc["secondary_phase"]) == ("Running", "Hanging")
    assert [n["kind"] for n in seen["tm.notify.p"]] == ["hung"]
    await restart_overdue(monitor, grace_s=300, now=datetime.now(UTC))  # still within its grace
    assert seen["tm.node.cmd.n1.stop"] == []
    await restart_overdue(monitor, grace_s=300, now=datetime.now(UTC) + timedelta(seconds=301))
    await restart_overdue(monitor, grace_s=300, now=datetime.now(UTC) + timedelta(seconds=302))  # once only
    assert [(s["reason"], s["attempt"]) for s in seen["tm.node.cmd.n1.stop"]] == [("hung", 1)]
    await publish(broker, exited("j", code=143, reason="terminated"))
    doc = await monitor.jobs.load("j")
    assert (doc["phase"], doc["requeue_cause"], doc["attempts"][0]["outcome"]) == ("Pending", "hung", "hung")
    assert seen["tm.job.status.*.*"][-1]["requeue_cause"] == "hung"


async def test_a_job_showing_life_again_is_not_restarted(hang_broker):
    broker, monitor, seen = hang_broker
    await publish(broker, hung("j"))
    await publish(broker, resumed("j"))
    assert (await monitor.jobs.load("j"))["secondary_phase"] == "Running"
    await restart_overdue(monitor, grace_s=0, now=datetime.now(UTC) + timedelta(hours=1))
    assert seen["tm.node.cmd.n1.stop"] == []


async def test_a_hang_reported_by_another_node_changes_nothing(hang_broker):
    broker, monitor, seen = hang_broker
    before = await monitor.jobs.load("j")
    await publish(broker, hung("j", node_id="n9"))  # on n9's own subject, for a task n9 does not run
    await broker.publish(
        hung("j").model_dump(mode="json"),
        "tm.job.task.n9.hung",  # n1's report, on n9's subject
        stream=stream_of("tm.job.task.n9.hung").name,
    )
    after = await monitor.jobs.load("j")
    assert (after["secondary_phase"], after["version"], list(after["hung_ranks"])) == ("Running", before["version"], [])
    assert seen["tm.notify.p"] == []
