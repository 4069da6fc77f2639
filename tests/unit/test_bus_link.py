"""A process whose bus connection is closed for good exits (its supervisor starts it again); its own close does not."""

import pytest
from faststream.nats import NatsBroker

from shared import bus
from shared.bus import BUS_CLOSED_EXIT, BusLink
from shared.service import Process


@pytest.fixture
def exits(monkeypatch) -> list[int]:
    codes: list[int] = []
    monkeypatch.setattr(bus.os, "_exit", codes.append)
    monkeypatch.setattr(bus, "EXIT_WHEN_CLOSED", True)  # as a process's entry point sets it
    return codes


async def test_a_connection_closed_while_the_process_is_not_stopping_ends_the_process(exits):
    link = BusLink()
    await link.closed()
    assert exits == [BUS_CLOSED_EXIT] and not link.connected


async def test_the_close_of_a_process_that_stops_is_its_own(exits):
    link = BusLink()
    app = Process(NatsBroker(), link=link)
    app.exit()  # a signal, or the lease's stop: FastStream closes the broker before the lifespan ends
    await link.closed()
    assert exits == [] and link.stopping


async def test_a_broker_used_as_a_library_is_left_to_see_its_close(exits, monkeypatch):
    monkeypatch.setattr(bus, "EXIT_WHEN_CLOSED", False)  # a test, a tool: no entry point set it
    await BusLink().closed()
    assert exits == []
