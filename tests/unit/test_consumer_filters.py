"""Each state machine's jobs consumer is delivered exactly the job events its handler table names (the server
filters), and a role may narrow only a consumer of a whole stream it already reads."""

import re
import typing

import pytest

from shared import busroles
from shared.bus import subjects_overlap
from shared.events import JobEvent, JobStatusChanged, TaskExited, TaskPreparing
from shared.handlers import subject_filters
from services.billing import handlers as billing
from services.estimator import handlers as estimator
from services.monitor import handlers as monitor
from services.placement import handlers as placement

JOB_EVENTS = typing.get_args(typing.get_args(JobEvent)[0])


def delivered(subscription: dict, event: type) -> bool:
    """Whether a consumer's server-side filters let an event type's subjects through."""
    subject = re.sub(r"\{[^}]*\}", "n1", event.subject_template)
    filters = subscription["config"].filter_subjects or [subscription["subject"]]
    return any(subjects_overlap(subject, f) for f in filters)


@pytest.mark.parametrize("service", [billing, estimator, monitor, placement], ids=lambda m: m.__name__)
def test_a_jobs_consumer_is_delivered_the_events_its_table_handles_and_no_other(service):
    subscription = service.JOBS.subscription
    handled = {e for e in JOB_EVENTS if e in service.EVENT_HANDLERS}
    assert handled and {e for e in JOB_EVENTS if delivered(subscription, e)} == handled


def test_what_each_state_machine_is_no_longer_sent():
    assert not delivered(monitor.JOBS.subscription, JobStatusChanged)  # it publishes them
    assert not delivered(placement.JOBS.subscription, TaskExited)  # it learns of ends from the statuses
    assert not delivered(estimator.JOBS.subscription, TaskExited)
    assert not delivered(billing.JOBS.subscription, TaskPreparing)
    assert subject_filters(monitor.EVENT_HANDLERS, within="tm.node.evt.>") == (
        "tm.node.evt.*.heartbeat",
        "tm.node.evt.*.registered",
        "tm.node.evt.provisioned",
        "tm.node.evt.released",
    )


def test_only_a_consumer_of_a_whole_stream_may_be_created_with_filters_its_request_does_not_name():
    monitor_rights = busroles.service("monitor").publish
    assert "$JS.API.CONSUMER.CREATE.TM_JOBS.monitor-jobs" in monitor_rights
    assert "$JS.API.CONSUMER.CREATE.TM_JOBS.monitor-jobs.tm.job.>" in monitor_rights
    submitter_rights = busroles.service("submitter").publish
    # its status consumer reads one subject of the jobs stream: it may not re-create it for the whole stream
    assert "$JS.API.CONSUMER.CREATE.TM_JOBS.submitter-status" not in submitter_rights
    assert "$JS.API.CONSUMER.CREATE.TM_JOBS.submitter-status.tm.job.status" in submitter_rights
    assert not any(s.startswith("$JS.API.CONSUMER.CREATE.TM_JOBS.monitor") for s in submitter_rights)
