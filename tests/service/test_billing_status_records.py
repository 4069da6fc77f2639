"""Which job statuses billing keeps on the job's record (for reconciliation and queued GPUs): not the completion of
a job that asks for no GPUs, done in its first attempt with every line closed, which nothing would read; every
status that a line still open, a later attempt or GPUs may need."""

from shared.bus import publish
from shared.jobs import Phase
from tests.factories import T0, exited, placed, started, submitted
from tests.service.test_billing_lifetimes import deliver
from tests.service.test_billing_reconcile import HOUR, later, status, tried


async def completed(broker, service, job_id: str, *, attempt: int = 1, version: int = 5, **spec) -> None:
    """Submitted, placed, started and ended for `attempt`, then its completion (earlier attempts said to end)."""
    await publish(broker, submitted(job_id=job_id, **spec))
    await deliver(
        broker,
        service,
        placed(job_id, attempt=attempt),
        started(job_id, attempt=attempt, at=T0),
        exited(job_id, attempt=attempt, at=T0 + HOUR),
    )
    attempts = tuple(tried(a, ended=T0 + HOUR) for a in range(1, attempt + 1))
    await publish(broker, status(job_id, version, Phase.COMPLETED, attempt=attempt, attempts=attempts, end=T0 + HOUR))


async def test_a_job_of_no_gpus_completed_at_its_first_attempt_leaves_its_record_as_submitted(billing):
    broker, service, _ = billing
    await completed(broker, service, "cpu")
    record = service.attempts.placements.jobs.docs["cpu"]
    assert (record["version"], record["finished"], record["gpus"]) == (0, False, 0)  # no write for its completion
    await publish(broker, status("cpu", 5, Phase.COMPLETED, attempts=(tried(1, ended=T0 + HOUR),), end=T0 + HOUR))
    await publish(broker, status("cpu", 4, Phase.RUNNING, attempts=(tried(1),)))  # a redelivery, an older one
    assert service.attempts.placements.jobs.docs["cpu"]["version"] == 0
    assert await service.attempts.reconcile(now=later(service)) == 0
    [line] = service.attempts.ledger.docs.values()
    assert (line["reason"], line["seconds"]) == ("completed", 3600)
    assert await service.attempts.placements.unfinished_gpus(project_id="p") == 0


async def test_a_job_of_gpus_a_later_attempt_or_an_open_line_is_kept_on_the_record(billing):
    broker, service, _ = billing
    await completed(broker, service, "gpu", gpu_count=1)
    await completed(broker, service, "second", attempt=2)
    await publish(broker, submitted(job_id="open"))
    await deliver(broker, service, placed("open"), started("open", at=T0))  # its end report is lost
    await publish(broker, status("open", 5, Phase.COMPLETED, attempts=(tried(1, ended=T0 + HOUR),), end=T0 + HOUR))
    docs = service.attempts.placements.jobs.docs
    assert [(docs[j]["version"], docs[j]["finished"]) for j in ("gpu", "second", "open")] == [(5, True)] * 3
    assert await service.attempts.reconcile(now=later(service)) == 1  # the open line, at the end its status gave
    assert service.attempts.running == {}


async def test_a_billing_that_did_not_store_the_submission_keeps_the_completion(billing):
    """After a restart nothing says here that the job asks for no GPUs: its completion is written as before."""
    broker, service, _ = billing
    await completed(broker, service, "restarted")
    service.attempts.placements.jobs.docs.pop("restarted")
    service.attempts.placements.owners.pop("restarted")
    service.attempts.placements.statuses.pop("restarted")
    await publish(broker, status("restarted", 6, Phase.COMPLETED, attempts=(tried(1, ended=T0 + HOUR),), end=T0))
    assert service.attempts.placements.jobs.docs["restarted"]["finished"] is True
    assert service.attempts.placements.jobs.docs["restarted"]["final_at"] == T0.timestamp()
