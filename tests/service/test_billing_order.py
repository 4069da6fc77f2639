"""A job's events in another order than they happened: a delivery lost on the way (a bus server killed under the
consumer) is delivered again after later events of its job were handled. Whatever the order, each attempt that ran
gets one closed line, charged from its start to its end, to its owner (the failover test's ledger held two lines
open for good: their starts came after their ends and their jobs' completions)."""

from datetime import timedelta

from shared.bus import publish
from shared.jobs import Phase
from services.billing.placements import PARK_TTL_S
from tests.factories import T0, exited, placed, started, submitted
from tests.service.test_billing_reconcile import HOUR, later, status, tried


def closed(service) -> list[tuple[str, float, str, str | None]]:
    return sorted(
        (d["_id"], d["seconds"], d["reason"], d["project_id"])
        for d in service.attempts.ledger.docs.values()
        if not d.get("open")
    )


async def end_then_start(broker, service, job_id: str) -> None:
    """Submitted and placed; its end handled, then its start (seen, as the bus stored it, an hour before)."""
    await publish(broker, submitted(job_id=job_id))
    await publish(broker, placed(job_id))
    service.attempts.clock.at(T0 + HOUR)
    await publish(broker, exited(job_id, at=T0 + HOUR))
    await service.attempts.started(started(job_id, at=T0), seen=T0)


async def test_an_end_handled_before_its_start_closes_the_line_the_start_opens(billing):
    broker, service, _ = billing
    await end_then_start(broker, service, "j")
    assert closed(service) == [("j:1:0", 3600.0, "completed", "p")]
    assert service.attempts.running == {} and service.attempts.ended_first == {}
    assert service.attempts.ends.docs == {}  # the kept end goes with its start
    await service.attempts.started(started("j", at=T0), seen=T0)  # each seen again: nothing changes
    await publish(broker, exited("j", at=T0 + HOUR))
    assert closed(service) == [("j:1:0", 3600.0, "completed", "p")] and service.attempts.running == {}


async def test_an_end_kept_for_its_start_outlives_a_restart(billing):
    """The leader that saw the end is killed; the next one reads the kept end at its start."""
    broker, service, _ = billing
    await publish(broker, submitted(job_id="k"))
    await publish(broker, placed("k"))
    service.attempts.clock.at(T0 + HOUR)
    await publish(broker, exited("k", at=T0 + HOUR))
    service.attempts.ended_first.clear()
    service.attempts.placements.first_placed.clear()
    assert await service.attempts.load() == 0
    assert list(service.attempts.ended_first) == ["k:1:0"]
    await service.attempts.started(started("k", at=T0), seen=T0)
    assert closed(service) == [("k:1:0", 3600.0, "completed", "p")] and service.attempts.running == {}


async def test_a_start_after_its_jobs_completion_is_closed_by_reconciliation_if_its_end_never_comes(billing):
    """A job of no GPUs completed in its first attempt with no line open keeps its completion in memory only; a
    start handled after it opens a line, and the completion is then written, for reconciliation to close it."""
    broker, service, _ = billing
    await publish(broker, submitted(job_id="c"))
    await publish(broker, placed("c"))
    await publish(broker, status("c", 5, Phase.COMPLETED, attempts=(tried(1, ended=T0 + HOUR),), end=T0 + HOUR))
    assert service.attempts.placements.jobs.docs["c"]["finished"] is False  # kept in memory only
    await service.attempts.started(started("c", at=T0), seen=T0)
    assert list(service.attempts.running) == ["c:1:0"]
    assert service.attempts.placements.jobs.docs["c"]["finished"] is True
    assert await service.attempts.reconcile(now=later(service)) == 1
    assert closed(service) == [("c:1:0", 3600.0, "reconciled", "p")]


async def test_a_placement_handled_before_its_submission_charges_the_jobs_owner(billing):
    broker, service, _ = billing
    await publish(broker, placed("o"))
    await publish(broker, submitted(job_id="o"))
    service.attempts.clock.at(T0)
    await publish(broker, started("o", at=T0))
    service.attempts.clock.at(T0 + HOUR)
    await publish(broker, exited("o", at=T0 + HOUR))
    assert closed(service) == [("o:1:0", 3600.0, "completed", "p")]
    assert service.attempts.ledger.docs["o:1:0"]["user_name"] == "alice"


async def test_an_end_whose_start_never_comes_is_forgotten_after_a_while(billing):
    """A task that failed before it started reports only its end: kept no longer than a parked event."""
    broker, service, _ = billing
    await publish(broker, submitted(job_id="f"))
    await publish(broker, placed("f"))
    service.attempts.clock.at(T0)
    await publish(broker, exited("f", at=T0, code=1, reason="failed"))
    assert list(service.attempts.ended_first) == ["f:1:0"]
    await service.attempts.reconcile(now=T0 + timedelta(seconds=PARK_TTL_S - 1))
    assert list(service.attempts.ended_first) == ["f:1:0"]
    await service.attempts.reconcile(now=T0 + timedelta(seconds=PARK_TTL_S + 1))
    assert service.attempts.ended_first == {} and service.attempts.ends.docs == {}
    assert closed(service) == []
