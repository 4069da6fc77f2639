"""Attempts whose end report was lost (a service killed mid-ack) are closed by reconciliation against the jobs'
statuses: at the end the status gives, once, and never while the attempt may still run."""

from datetime import timedelta

from shared.bus import publish
from shared.clock import utcnow
from shared.events import Attempt, JobStatusChanged
from shared.jobs import Phase, SecondaryPhase
from tests.factories import T0, exited, placed, started, submitted

HOUR = timedelta(hours=1)


def status(
    job_id: str, version: int, phase: Phase, *, attempt: int = 1, attempts: tuple[Attempt, ...] = (), end=None
) -> JobStatusChanged:
    return JobStatusChanged(
        event_id=f"{job_id}:status:{version}",
        job_id=job_id,
        project_id="p",
        user_name="alice",
        version=version,
        phase=phase,
        secondary_phase=SecondaryPhase(phase.value) if phase != Phase.PENDING else SecondaryPhase.QUEUING,
        attempt=attempt,
        attempts=attempts,
        end_time=end,
    )


def tried(attempt: int, *, ended=None, outcome: str = "") -> Attempt:
    return Attempt(attempt=attempt, node_ids=("n1",), placed_at=T0, started_at=T0, ended_at=ended, outcome=outcome)


async def run(broker, job_id: str, *, attempt: int = 1) -> None:
    await publish(broker, placed(job_id, attempt=attempt))
    await publish(broker, started(job_id, attempt=attempt, at=T0))


def later(service) -> object:
    return utcnow() + timedelta(seconds=service.attempts.reconcile_grace_s + 1)


async def test_an_attempt_of_a_finished_job_is_closed_at_its_end_once(billing):
    broker, service, _ = billing
    await publish(broker, submitted(job_id="j1"))
    await run(broker, "j1")  # its TaskExited is lost
    await publish(broker, status("j1", 5, Phase.COMPLETED, attempts=(tried(1, ended=T0 + HOUR),), end=T0 + HOUR))
    assert await service.attempts.reconcile() == 0  # known only just now: its own report may still come
    assert await service.attempts.reconcile(now=later(service)) == 1
    [line] = [d for d in service.attempts.ledger.docs.values() if not d.get("open")]
    assert (line["ended_at"], line["reason"], line["seconds"]) == (T0 + HOUR, "reconciled", 3600)
    assert service.attempts.running == {}
    assert await service.attempts.reconcile(now=later(service)) == 0
    await publish(broker, exited("j1", at=T0 + 2 * HOUR))  # the lost report turns up after all: nothing changes
    assert [(d["seconds"], d["reason"]) for d in service.attempts.ledger.docs.values()] == [(3600, "reconciled")]


async def test_a_superseded_attempt_is_closed_and_the_running_one_is_not(billing):
    broker, service, _ = billing
    await publish(broker, submitted(job_id="j2"))
    await run(broker, "j2", attempt=1)
    lost = tried(1, ended=T0 + HOUR / 6, outcome="node_lost")
    await publish(broker, status("j2", 7, Phase.PENDING, attempt=2, attempts=(lost, tried(2))))
    await run(broker, "j2", attempt=2)
    await publish(broker, status("j2", 8, Phase.RUNNING, attempt=2, attempts=(lost, tried(2))))
    await publish(broker, status("j2", 6, Phase.RUNNING, attempt=1, attempts=(tried(1),)))  # an older one, late
    assert await service.attempts.reconcile(now=later(service)) == 1
    [line] = [d for d in service.attempts.ledger.docs.values() if not d.get("open")]
    assert (line["attempt"], line["ended_at"]) == (1, T0 + HOUR / 6)
    assert list(service.attempts.running) == ["j2:2:0"]


async def test_a_running_job_keeps_its_attempt_open(billing):
    broker, service, _ = billing
    await publish(broker, submitted(job_id="j3"))
    await run(broker, "j3")
    await publish(broker, status("j3", 3, Phase.RUNNING, attempts=(tried(1),)))
    assert await service.attempts.reconcile(now=later(service)) == 0
    assert list(service.attempts.running) == ["j3:1:0"]
