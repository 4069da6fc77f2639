"""Each process's table of what it reacts to, and the dispatch that follows it."""

import importlib
import inspect
import logging
import types
import typing

import pytest
from faststream.nats import NatsRouter

from shared.events import Message, StartTask, StopTask
from shared.handlers import dispatch
from services.agent.handlers import COMMAND_HANDLERS, command_router
from tests.factories import exited, started

SERVICES = ("submitter", "placement", "monitor", "estimator", "billing")


def decoded(annotation: typing.Any) -> set[type]:
    """The types an annotation admits (Annotated and unions unwrapped)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return decoded(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return {t for arg in typing.get_args(annotation) for t in decoded(arg)}
    return {annotation}


def delivered(router: NatsRouter) -> dict[str, set[type]]:
    """Per subscription (its function's name), the message types it decodes: its first parameter's annotation."""
    found = {}
    for subscriber in router.subscribers:
        for call in subscriber.calls:
            function = inspect.unwrap(call.handler._original_call)  # FastStream keeps the declared function here
            first = next(iter(inspect.signature(function).parameters))
            found[function.__name__] = decoded(typing.get_type_hints(function, include_extras=True)[first])
    return found


def tables() -> list[tuple[str, dict, NatsRouter]]:
    services = [(s, importlib.import_module(f"services.{s}.handlers")) for s in SERVICES]
    return [(s, m.EVENT_HANDLERS, m.router) for s, m in services] + [("agent", COMMAND_HANDLERS, command_router("n1"))]


class Recorder:
    def __init__(self) -> None:
        self.seen: list[Message] = []

    async def record(self, event: Message) -> str:
        self.seen.append(event)
        return "handled"


async def test_an_event_goes_to_the_handler_of_its_type_with_the_service_first():
    service = Recorder()
    event = started("j", node_id="n1")
    assert await dispatch({type(event): Recorder.record}, event, service) == "handled"
    assert service.seen == [event]


async def test_an_event_of_a_type_the_table_does_not_name_is_logged_and_dropped(caplog):
    service = Recorder()
    with caplog.at_level(logging.DEBUG, logger="shared.handlers"):
        assert await dispatch({StartTask: Recorder.record}, exited("j", node_id="n1"), service) is None
    assert service.seen == []
    assert "Recorder: no handler for TaskExited on tm.job.task.n1.exited; dropped" in caplog.messages


@pytest.mark.parametrize(("process", "table", "router"), tables(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_entry_of_a_table_is_a_message_one_of_its_subscriptions_delivers(process, table, router):
    subscriptions = delivered(router)
    deliverable = set().union(*subscriptions.values())
    assert table and all(issubclass(t, Message) for t in table)
    assert set(table) <= deliverable, (
        f"{process} handles what none of its subscriptions delivers: "
        f"{sorted(t.__name__ for t in set(table) - deliverable)}"
    )
    idle = [
        name
        for name, kinds in subscriptions.items()
        if kinds <= set(Message.__subclasses__()) and not kinds & set(table)
    ]
    assert not idle, f"{process}: subscriptions whose every message the table drops: {idle}"


def test_the_agent_starts_and_stops_tasks():
    assert COMMAND_HANDLERS.keys() == {StartTask, StopTask}
