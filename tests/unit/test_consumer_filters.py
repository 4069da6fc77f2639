"""Each state machine's jobs consumer is delivered exactly the job events its handler table names (the server
filters), as the operator declares it: no role may create or change it."""

import re
import typing

import pytest

from shared import busroles, bustopology
from shared.bus import subjects_overlap
from shared.events import JobEvent, JobStatusChanged, TaskExited, TaskPreparing
from shared.handlers import subject_filters
from services.billing import handlers as billing
from services.estimator import handlers as estimator
from services.monitor import handlers as monitor
from services.placement import handlers as placement

JOB_EVENTS = typing.get_args(typing.get_args(JobEvent)[0])


def delivered(subscription: dict, event: type) -> bool:
    """Whether a consumer's server-side filters let any of an event type's subjects through."""
    subject = re.sub(r"\{[^}]*\}", "*", event.subject_template)
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


@pytest.mark.parametrize("service", [billing, estimator, monitor, placement], ids=lambda m: m.__name__)
def test_a_jobs_consumer_is_declared_with_its_tables_filters_and_no_role_may_create_it(service):
    consumer = service.JOBS.subscription["durable"]
    declared = next(s for role in bustopology.CONSUMERS.values() for s in role if s["durable"] == consumer)
    assert declared["config"].filter_subjects == service.JOBS.subscription["config"].filter_subjects
    for role in busroles.SERVICES:
        assert not any(s.startswith("$JS.API.CONSUMER.CREATE.") for s in busroles.service(role).publish)
