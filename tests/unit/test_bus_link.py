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


async def test_the_minters_own_connection_closed_for_good_ends_it_and_its_stop_does_not(exits, monkeypatch, tmp_path):
    """The minter connects with nats-py itself (not a wired broker): a revoked connection ended its process too."""
    from services.minter import app as minter_app

    class Client:
        async def subscribe(self, subject, cb):
            pass

        async def flush(self):
            pass

        async def close(self):
            await given["closed_cb"]()  # nats-py calls it on any close

    given: dict = {}

    async def connect(servers, **options):
        given.update(options)
        return Client()

    async def sweeping(self):
        await given["closed_cb"]()  # the server closed it while the minter ran

    monkeypatch.setattr(minter_app.nats, "connect", connect)
    monkeypatch.setattr(minter_app.MinterProcess, "sweeping", sweeping)
    cluster = tmp_path / "cluster.toml"
    cluster.write_text("")
    await minter_app.serve(minter_app.MinterSettings(minter_file=tmp_path / "minter.json", cluster_file=cluster))
    assert exits == [BUS_CLOSED_EXIT]  # once: the close at its stop was its own
