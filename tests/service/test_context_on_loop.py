"""A subscriber's `Context` parameters are looked up on the event loop: no message costs a hand-off to a thread."""

import inspect
import threading
import typing

import fast_depends.utils
import pytest
from fast_depends.library import CustomField
from faststream.nats import NatsBroker, TestNatsBroker

from shared.bus import durable
from shared.context import Context, NatsMessage
from shared.events import JobDeleted
from services.agent.handlers import command_router
from services.billing import handlers as billing
from services.estimator import handlers as estimator
from services.monitor import handlers as monitor
from services.placement import handlers as placement
from services.submitter import handlers as submitter
from tests.factories import unique


@pytest.fixture
def threads_used(monkeypatch) -> list[str]:
    """What fast_depends hands to a worker thread while a message is handled."""
    used: list[str] = []
    to_thread = fast_depends.utils.run_in_threadpool

    async def counted(func, *args, **kwargs):
        used.append(getattr(func, "__qualname__", repr(func)))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(fast_depends.utils, "run_in_threadpool", counted)
    return used


async def test_a_delivered_event_resolves_its_service_and_message_without_a_thread(threads_used):
    broker = NatsBroker()
    service = object()
    seen: list[tuple[str, object, str, str]] = []

    @broker.subscriber(**durable("tm.job.deleted", consumer=unique("context-test")))
    async def on_deleted(event: JobDeleted, message: NatsMessage, svc: object = Context("svc")) -> None:
        seen.append((event.job_id, svc, message.raw_message.subject, threading.current_thread().name))

    async with TestNatsBroker(broker) as test_broker:
        test_broker.context.set_global("svc", service)
        for i in range(3):
            event = JobDeleted(event_id=unique("e"), job_id=f"job-{i}")
            await test_broker.publish(event.model_dump(mode="json"), event.subject, stream="TM_JOBS")

    assert [(job, svc, subject) for job, svc, subject, _ in seen] == [
        (f"job-{i}", service, "tm.job.deleted") for i in range(3)
    ]
    assert {thread for *_, thread in seen} == {threading.main_thread().name}
    assert threads_used == []


def _context_fields(handler) -> list[CustomField]:
    """The FastStream parameters (`Context`, `NatsMessage`) a subscriber's function declares."""
    fields = []
    for parameter in inspect.signature(handler).parameters.values():
        if isinstance(parameter.default, CustomField):
            fields.append(parameter.default)
        for hint in typing.get_args(parameter.annotation)[1:]:
            if isinstance(hint, CustomField):
                fields.append(hint)
    return fields


@pytest.mark.parametrize("module", [billing, estimator, monitor, placement, submitter], ids=lambda m: m.__name__)
def test_every_service_subscriber_resolves_its_context_on_the_loop(module):
    subscribers = [w._original_call for w in vars(module).values() if hasattr(w, "_original_call")]
    fields = [(f.__name__, field) for f in subscribers for field in _context_fields(f)]
    assert subscribers and fields
    on_a_thread = [name for name, field in fields if not fast_depends.utils.is_coroutine_callable(field.use)]
    assert on_a_thread == []


def test_the_agents_command_subscriber_resolves_its_context_on_the_loop():
    """The agent's subscriber is made per node (`command_router`); it used FastStream's own `Context`: a thread
    hand-off for every start and stop command."""
    [subscriber] = command_router("node-1").subscribers
    handlers = [call.handler._original_call for call in subscriber.calls]
    fields = [field for handler in handlers for field in _context_fields(handler)]
    assert fields
    assert all(fast_depends.utils.is_coroutine_callable(field.use) for field in fields)
