"""A deleted job stays deleted for placement: its submission delivered again (its acknowledgement died with a bus
server, and it comes back after the ack wait, after the job finished and was deleted) queues nothing."""

from shared.bus import publish
from shared.events import JobDeleted
from shared.jobs import Phase
from tests.factories import submitted
from tests.service.test_billing_reconcile import status


async def test_a_submission_delivered_again_after_its_job_was_deleted_queues_nothing(placement):
    broker, service, _ = placement
    first = submitted(job_id="gone")
    await publish(broker, first)
    assert "gone" in service.queue
    await publish(broker, status("gone", 4, Phase.COMPLETED))
    assert service.queue["gone"].state == "done"
    await publish(broker, JobDeleted(event_id="gone:deleted", job_id="gone"))
    assert "gone" not in service.queue
    await publish(broker, first)  # delivered again
    assert "gone" not in service.queue and not service.queued
    await publish(broker, submitted(job_id="next"))  # a new job is queued as ever
    assert service.queue["next"].state == "queued"
